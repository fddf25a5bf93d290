#!/usr/bin/env python3
"""Runs every <name>.onnx in DIR (written by kiln_test_onnx) through ONNX Runtime's CPU execution
provider on the inputs beside it (<name>.b<k>.in<i>.npy) and compares with kiln's outputs
(<name>.b<k>.out<j>.npy).

    python3 tests/onnx/check_ort.py DIR [--tol 1e-4]

Installs onnxruntime with pip when it is missing (as root; otherwise prints the command). Exits 77
(a ctest skip) when it cannot be installed, 1 on any mismatch, 0 when everything agrees."""
import glob
import os
import subprocess
import sys


def ensure_ort():
    try:
        import onnxruntime  # noqa: F401
        return True
    except ImportError:
        pass
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "onnxruntime", "numpy"]
    if os.geteuid() != 0:
        print("onnxruntime is missing; install it with: " + " ".join(cmd), file=sys.stderr)
        return False
    if subprocess.call(cmd + ["--break-system-packages"]) != 0 and subprocess.call(cmd) != 0:
        print("could not install onnxruntime (no network?)", file=sys.stderr)
        return False
    return True


def main():
    args = sys.argv[1:]
    tol = 1e-4
    if "--tol" in args:
        i = args.index("--tol")
        tol = float(args[i + 1])
        del args[i:i + 2]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    d = args[0]
    if not ensure_ort():
        return 77
    import numpy as np
    import onnxruntime as ort
    models = sorted(glob.glob(os.path.join(d, "*.onnx")))
    if not models:
        print("no .onnx files in " + d, file=sys.stderr)
        return 1
    bad = 0
    for path in models:
        name = os.path.basename(path)[:-5]
        if not os.path.exists(os.path.join(d, f"{name}.b0.in0.npy")):
            # a file of another test (the ONNX import round trips), with no inputs to run it on
            print(f"{name}: no inputs beside it ({name}.b0.in0.npy), not an ONNX Runtime check")
            continue
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        ins = [i.name for i in sess.get_inputs()]
        k = 0
        while os.path.exists(os.path.join(d, f"{name}.b{k}.in0.npy")):
            feed = {n: np.load(os.path.join(d, f"{name}.b{k}.in{i}.npy")) for i, n in enumerate(ins)}
            got = sess.run(None, feed)
            worst = 0.0
            for j, g in enumerate(got):
                want = np.load(os.path.join(d, f"{name}.b{k}.out{j}.npy"))
                if g.shape != want.shape:
                    print(f"{name} b{k} output {j}: shape {g.shape}, kiln {want.shape}")
                    bad += 1
                    continue
                a, b = g.astype(np.float64), want.astype(np.float64)
                err = float(np.max(np.abs(a - b) / np.maximum(1.0, np.abs(b)))) if a.size else 0.0
                if not err <= tol:
                    print(f"{name} b{k} output {j}: max relative difference {err:.3g} > {tol}")
                    bad += 1
                worst = max(worst, err)
            shapes = ", ".join(str(tuple(v.shape)) for v in feed.values())
            print(f"{name}: inputs {shapes}: {len(got)} outputs, max relative difference to kiln {worst:.2e}")
            k += 1
    print(f"onnxruntime {ort.__version__}: {len(models)} models, {'all agree' if bad == 0 else str(bad) + ' mismatches'}")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
