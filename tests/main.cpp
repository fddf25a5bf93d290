// doctest's main for every test executable. After the run it prints how many test cases their skip
// decorator skipped among those the filters selected (GPU tests without a GPU):
//   [kiln] N test cases skipped by their decorator
// which tests/run.sh sums. doctest's own summary counts the test cases the filters left out as
// skipped too, and a ctest entry of a unity build (KILN_UNITY_TESTS) leaves out every other file's.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace {
/// The test cases the command line's filters select, counting those with a skip decorator or not.
long selected(int argc, char** argv, bool with_skipped) {
    std::vector<const char*> args(argv, argv + argc);
    args.push_back("--count");
    if (with_skipped) args.push_back("--no-skip");
    doctest::Context c(static_cast<int>(args.size()), args.data());
    std::ostringstream out;
    c.setCout(&out);
    c.run();
    const std::string s = out.str();
    const std::size_t at = s.find("filters: ");
    return at == std::string::npos ? 0 : std::atol(s.c_str() + at + 9);
}
}  // namespace

int main(int argc, char** argv) {
    int result = 0;
    {
        doctest::Context context(argc, argv);
        result = context.run();
        if (context.shouldExit()) return result;  // --help, --count, --list-test-cases, ...
    }
    // (--no-skip on the command line runs them: then none is skipped)
    const long skipped = selected(argc, argv, true) - selected(argc, argv, false);
    std::printf("[kiln] %ld test cases skipped by their decorator\n", skipped);
    return result;
}
