#include <nvrtc.h>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
int main(int argc, char** argv) {
  std::ifstream f(argv[1]); std::stringstream ss; ss << f.rdbuf(); std::string src = ss.str();
  const char* opts[] = {"-arch=sm_90", "--std=c++17", "-default-device", "-minimal", "-fdevice-time-trace=/tmp/exp/trace.json"};
  nvrtcProgram p; nvrtcCreateProgram(&p, src.c_str(), "k.cu", 0, nullptr, nullptr);
  int rc = nvrtcCompileProgram(p, 5, opts);
  size_t n; nvrtcGetProgramLogSize(p,&n); std::string l(n,0); nvrtcGetProgramLog(p,l.data()); printf("rc %d %s\n", rc, l.substr(0,500).c_str());
}
