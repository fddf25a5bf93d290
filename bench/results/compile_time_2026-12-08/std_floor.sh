#!/usr/bin/env bash
# What an empty separate-mode main costs that kiln's own declarations do not: a file including only
# the standard headers kiln.hpp pulls in (listed from g++ -E of bench/compile_time/empty.cpp), the
# same plus xsimd, and the empty main itself; alternating, ROUNDS rounds (default 3).
set -eu
cd "$(dirname "$0")/../../.."
F=(-std=c++20 -O2 -Iinclude -I/usr/include/eigen3 -DKILN_WITH_CUDA=1 -isystem /usr/local/cuda/include -DKILN_SEPARATE_COMPILATION)
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
g++ "${F[@]}" -E bench/compile_time/empty.cpp -o "$T/e.ii"
grep -o '^# [0-9]* "/usr/include/c++/12/[a-z_]*"' "$T/e.ii" | awk '{print $3}' | tr -d '"' | sort -u | sed 's|/usr/include/c++/12/||' > "$T/h.txt"
{ while read -r h; do echo "#include <$h>"; done < "$T/h.txt"; echo 'int main() {}'; } > "$T/std.cpp"
{ while read -r h; do echo "#include <$h>"; done < "$T/h.txt"; echo '#include <xsimd/xsimd.hpp>'; echo 'int main() {}'; } > "$T/stdxs.cpp"
echo "$(wc -l < "$T/h.txt") standard headers: $(tr '\n' ' ' < "$T/h.txt")"
for r in $(seq "${ROUNDS:-3}"); do
  for f in "$T/std.cpp" "$T/stdxs.cpp" bench/compile_time/empty.cpp bench/compile_time/hello.cpp; do
    /usr/bin/time -f "$(basename "$f") %e s %M KB" g++ "${F[@]}" -c "$f" -o "$T/x.o"
  done
done 2>&1 | sort
