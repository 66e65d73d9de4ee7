// What bertserve-loadgen (loadgen.cc, gRPC) and bertserve-http-loadgen (http_loadgen.cc) share: the records of
// the requests file and a phase's steps (warm-up, "ready", "go", the measured part, its stats line).
// The build keys each binary by its source and this header (service/grpc/native/build.py).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace phase {

struct Record {
  double offset_s;  // scheduled send time from the phase's start; < 0: closed loop
  std::string bytes;
};

// REQUESTS_FILE: records of [f64 scheduled send offset, s][u32 length][bytes].
inline std::vector<Record> read_records(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(std::string("cannot read ") + path);
  std::vector<Record> records;
  while (true) {
    double offset;
    uint32_t length;
    if (!in.read(reinterpret_cast<char*>(&offset), sizeof offset)) {
      if (in.gcount() != 0) throw std::runtime_error("truncated record head");
      break;
    }
    if (!in.read(reinterpret_cast<char*>(&length), sizeof length)) throw std::runtime_error("truncated");
    std::string bytes(length, '\0');
    if (!in.read(bytes.data(), length)) throw std::runtime_error("truncated record");
    records.push_back({offset, std::move(bytes)});
  }
  return records;
}

inline double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// `run(first, last, time_limit_s, record)` sends requests [first, last) and returns how many it sent: the
// first `warmup` unrecorded, then "ready" on stdout and a line awaited on stdin, then the rest, recorded, and
// the stats line {"seconds", "cpu_s", "sent", "stopped_early"}. Returns the exit code (4: stdin closed).
template <class Run>
int drive(size_t count, size_t warmup, double time_limit_s, std::FILE* out, const char* out_path, Run&& run) {
  run(0, warmup, 0.0, false);
  std::cout << "ready" << std::endl;
  std::string go;
  if (!std::getline(std::cin, go)) return 4;  // the driver went away
  const double cpu_before = process_cpu_seconds();
  const auto start = std::chrono::steady_clock::now();
  const size_t sent = run(warmup, count, time_limit_s, true);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double cpu_s = process_cpu_seconds() - cpu_before;
  if (std::ferror(out) || std::fclose(out) != 0) throw std::runtime_error(std::string("cannot write ") + out_path);
  std::printf("{\"seconds\": %.9f, \"cpu_s\": %.9f, \"sent\": %zu, \"stopped_early\": %d}\n", seconds, cpu_s,
              sent, sent < count - warmup ? 1 : 0);
  std::fflush(stdout);
  return 0;
}

}  // namespace phase
