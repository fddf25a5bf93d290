// An MLP classifier on scikit-learn's handwritten digits (1797 8x8 images, 10 classes), read from
// the file that ships inside the scikit-learn package (tests/fetch_digits.sh puts it at DIR/digits.csv;
// nothing is downloaded here). 64 -> 128 (ReLU) -> 10, cross entropy, AdamW, batch 64; the whole
// training step (forward, loss, backward, AdamW) is one kiln::compile program. 1437 images train,
// 360 (a seeded shuffle) test; a progress line per epoch, then the test accuracy.
//   example_train_digits DIGITS_CSV [--epochs N] [--min-accuracy A] [--cuda]
// Exit 77 (a ctest skip) when the file is missing; 1 when the accuracy is below --min-accuracy.
#include <kiln/kiln.hpp>
#include <kiln/nn.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

struct Classifier {
    kiln::nn::Linear fc1, fc2;
    explicit Classifier(kiln::Device dev) : fc1(64, 128, true, kiln::Act::relu, {kiln::DType::f32, dev}), fc2(128, 10, true, kiln::Act::none, {kiln::DType::f32, dev}) {}
    kiln::Tensor operator()(const kiln::Tensor& x) const { return fc2(fc1(x)); }
    template <class F> void visit(const std::string& p, F&& f) {
        fc1.visit(p + "fc1.", f);
        fc2.visit(p + "fc2.", f);
    }
};

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s DIGITS_CSV [--epochs N] [--min-accuracy A] [--cuda]\n", argv[0]);
        return 2;
    }
    int epochs = 40;
    double min_accuracy = 0.95;
    kiln::Device dev = kiln::Device::cpu();
    for (int i = 2; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--epochs") && i + 1 < argc) epochs = std::atoi(argv[++i]);
        else if (!std::strcmp(argv[i], "--min-accuracy") && i + 1 < argc) min_accuracy = std::atof(argv[++i]);
        else if (!std::strcmp(argv[i], "--cuda")) dev = kiln::Device::cuda(0);
        else {
            std::fprintf(stderr, "%s: unknown option '%s'\n", argv[0], argv[i]);
            return 2;
        }
    }
    std::ifstream f(argv[1]);
    if (!f) {
        std::printf("train_digits: SKIPPED: %s not found (bash tests/fetch_digits.sh DIR puts scikit-learn's digits there)\n", argv[1]);
        return 77;
    }
    std::vector<float> pixels;
    std::vector<std::int64_t> labels;
    for (std::string line; std::getline(f, line);) {
        if (line.empty()) continue;
        std::stringstream s(line);
        std::string cell;
        for (int c = 0; c < 65 && std::getline(s, cell, ','); ++c) {
            if (c < 64) pixels.push_back(std::stof(cell) / 16.0f);  // 0..16 ink levels
            else labels.push_back(std::stoll(cell));
        }
    }
    const auto n = static_cast<std::int64_t>(labels.size());
    if (n != 1797 || static_cast<std::int64_t>(pixels.size()) != n * 64) {
        std::fprintf(stderr, "train_digits: %s is not scikit-learn's digits (%lld rows)\n", argv[1], static_cast<long long>(n));
        return 1;
    }
    // a seeded shuffle, then 80% train / 20% test
    std::vector<std::int64_t> order(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(0));
    auto take = [&](std::int64_t from, std::int64_t to, kiln::Tensor& x, kiln::Tensor& y) {
        x = kiln::empty({to - from, 64});
        y = kiln::empty({to - from}, kiln::DType::i64);
        for (std::int64_t i = from; i < to; ++i) {
            const std::int64_t r = order[static_cast<std::size_t>(i)];
            for (int c = 0; c < 64; ++c) x.at<float>({i - from, c}) = pixels[static_cast<std::size_t>(r * 64 + c)];
            y.at<std::int64_t>({i - from}) = labels[static_cast<std::size_t>(r)];
        }
        x = x.to(dev);
        y = y.to(dev);
    };
    const std::int64_t n_train = n - 360, batch = 64;
    kiln::Tensor x_train, y_train, x_test, y_test;
    take(0, n_train, x_train, y_train);
    take(n_train, n, x_test, y_test);

    kiln::manual_seed(0);
    Classifier model(dev);
    kiln::nn::AdamW opt(kiln::nn::parameters(model), {.lr = 3e-3, .weight_decay = 1e-4});
    auto step = kiln::compile([&](const kiln::Tensor& x, const kiln::Tensor& y) {
        opt.zero_grad();
        kiln::Tensor loss = kiln::nn::cross_entropy(model(x), y);
        loss.backward();
        opt.step();
        return loss.detach();
    }, {.fullgraph = true});
    auto accuracy = [&](const kiln::Tensor& x, const kiln::Tensor& y) {
        const kiln::no_grad off;
        const kiln::Tensor hit = kiln::Tensor(kiln::argmax(model(x), 1) == y);
        return kiln::sum(kiln::cast(hit, kiln::DType::f32)).item<double>() / static_cast<double>(y.numel());
    };
    for (int e = 0; e < epochs; ++e) {
        double total = 0;
        int batches = 0;
        for (std::int64_t b = 0; b + batch <= n_train; b += batch, ++batches)  // full batches: one program shape
            total += step(x_train.slice(0, b, b + batch).contiguous(), y_train.slice(0, b, b + batch).contiguous()).item<double>();
        std::printf("epoch %2d  loss %.4f  train accuracy %.3f  test accuracy %.3f\n", e + 1, total / batches, accuracy(x_train, y_train),
                    accuracy(x_test, y_test));
    }
    const double acc = accuracy(x_test, y_test);
    std::printf("test accuracy %.3f after %d epochs (%d compile(s) of the training step, %d kernels)\n", acc, epochs, step.compiles(),
                step.kernels());
    if (acc < min_accuracy) {
        std::fprintf(stderr, "train_digits: test accuracy %.3f is below %.2f\n", acc, min_accuracy);
        return 1;
    }
    return 0;
}
