#include <kiln/cache/files.hpp>
#include <fstream>
#include <sstream>
#include <iostream>
#include <string>
static std::string slurp(const char* p) { std::ifstream f(p, std::ios::binary); std::stringstream s; s << f.rdbuf(); return s.str(); }
int main(int, char** argv) {  // remeta SO META: rewrites META's size and checksum lines for SO
    const std::string so = slurp(argv[1]), meta = slurp(argv[2]);
    std::istringstream in(meta); std::string l1, l2, l3; std::getline(in, l1); std::getline(in, l2); std::getline(in, l3);
    const std::string rest = meta.substr(l1.size() + l2.size() + l3.size() + 3);
    std::ofstream(argv[2], std::ios::binary) << l1 << "\n" << so.size() << "\n" << kiln::cache::to_hex(kiln::cache::hash64(so)) << "\n" << rest;
}
