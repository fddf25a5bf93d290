// times NVRTC (cubin sm_90) on files with option sets, alternating; min and median of reps
#include <nvrtc.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>
static std::vector<std::string> split(const std::string& s) { std::vector<std::string> v; std::stringstream ss(s); std::string w; while (ss >> w) v.push_back(w); return v; }
int main(int argc, char** argv) {
  // argv: reps, then files; option sets fixed below
  int reps = std::atoi(argv[1]);
  std::vector<std::string> sets = {"-arch=sm_90 --std=c++17 -default-device", "-arch=sm_90 --std=c++17 -default-device -minimal",
                                   "-arch=sm_90 --std=c++11 -default-device -minimal"};
  for (int fi = 2; fi < argc; ++fi) {
    std::ifstream f(argv[fi]); std::stringstream ss; ss << f.rdbuf(); std::string src = ss.str();
    std::map<int, std::vector<double>> t;
    for (int r = 0; r < reps; ++r)
      for (int k = 0; k < (int)sets.size(); ++k) {
        auto o = split(sets[k]); std::vector<const char*> opts; for (auto& x : o) opts.push_back(x.c_str());
        auto t0 = std::chrono::steady_clock::now();
        nvrtcProgram p; nvrtcCreateProgram(&p, src.c_str(), "k.cu", 0, nullptr, nullptr);
        if (nvrtcCompileProgram(p, (int)opts.size(), opts.data()) != NVRTC_SUCCESS) { size_t n; nvrtcGetProgramLogSize(p,&n); std::string l(n,0); nvrtcGetProgramLog(p,l.data()); printf("%s [%s]: %s\n", argv[fi], sets[k].c_str(), l.substr(0,300).c_str()); t[k].push_back(0); nvrtcDestroyProgram(&p); continue; }
        nvrtcDestroyProgram(&p);
        t[k].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
    printf("%s:", argv[fi]);
    for (auto& [k, v] : t) { std::sort(v.begin(), v.end()); printf("  [%d] min %.1f med %.1f", k, v[0], v[v.size()/2]); }
    printf("\n");
  }
}
