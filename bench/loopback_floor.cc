// bench_loopback_floor: the time to move a number of bytes over one loopback TCP stream, the
// floor a round's transfers are held against (bench/round_overhead.sh passes 2 x N x the
// model's bytes: every client's download and upload).
//
//   bench_loopback_floor --bytes N [--repeat 9] [--write-kib 1024]
//
// A sender thread writes the bytes through a 127.0.0.1 connection; the receiver reads them
// all, timed from the first byte received to the last. After one uncounted warm-up transfer,
// prints every repetition and the median in one line: floor_bytes= floor_ms= floor_gbps=.
// One transfer's time moves a lot on a shared virtual machine (on one of 2026-12-03, 60 to
// 139 ms for the same 355 MB within a second), so the median is of nine by default.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "base/flags.h"

namespace {

using Clock = std::chrono::steady_clock;

const char kUsage[] = R"(bench_loopback_floor: time to move --bytes over one loopback TCP stream.

Usage: bench_loopback_floor --bytes N [--repeat 9] [--write-kib 1024]

Flags:
)";

// Sends `total` bytes in writes of `write_bytes` through a fresh loopback connection and
// returns the seconds from the first write to the last byte received, or a negative number.
double MeasureOnce(uint64_t total, size_t write_bytes) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(listener, 1) != 0 || ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    std::fprintf(stderr, "bench_loopback_floor: cannot listen on 127.0.0.1: %s\n", std::strerror(errno));
    if (listener >= 0) ::close(listener);
    return -1;
  }
  bool sent_all = false;
  std::thread sender([&] {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      if (fd >= 0) ::close(fd);
      return;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::vector<char> data(write_bytes, 1);
    uint64_t sent = 0;
    while (sent < total) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(write_bytes, total - sent));
      const ssize_t w = ::send(fd, data.data(), n, MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;
      sent += static_cast<uint64_t>(w);
    }
    sent_all = sent == total;
    ::close(fd);
  });
  const int fd = ::accept(listener, nullptr, nullptr);
  ::close(listener);
  double seconds = -1;
  if (fd >= 0) {
    std::vector<char> data(write_bytes);
    uint64_t got = 0;
    Clock::time_point start{};
    while (got < total) {
      const ssize_t r = ::recv(fd, data.data(), data.size(), 0);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      if (got == 0) start = Clock::now();
      got += static_cast<uint64_t>(r);
    }
    if (got == total) seconds = std::chrono::duration<double>(Clock::now() - start).count();
    ::close(fd);
  }
  sender.join();
  return sent_all ? seconds : -1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tessera;
  int64_t bytes = 0;
  int64_t repeat = 9;
  int64_t write_kib = 1024;
  bool help = false;
  FlagSet flags;
  flags.Int("bytes", &bytes, "bytes to move (required)");
  flags.Int("repeat", &repeat, "repetitions; the median is reported");
  flags.Int("write-kib", &write_kib, "size of each write in KiB");
  flags.Bool("help", &help, "show this help");
  if (Status s = flags.ParseFlagsOnly(argc, argv); !s.ok()) {
    std::cerr << "bench_loopback_floor: " << s.message() << "\n";
    return 2;
  }
  if (help) {
    std::cout << kUsage << flags.Usage();
    return 0;
  }
  if (!flags.positional().empty()) {
    std::cerr << "bench_loopback_floor: unexpected argument '" << flags.positional().front() << "'\n";
    return 2;
  }
  if (bytes < 1 || bytes > (int64_t{1} << 40)) {
    std::cerr << "bench_loopback_floor: --bytes: expected 1 to 2^40, got " << bytes << "\n";
    return 2;
  }
  if (repeat < 1 || repeat > 100) {
    std::cerr << "bench_loopback_floor: --repeat: expected 1 to 100, got " << repeat << "\n";
    return 2;
  }
  if (write_kib < 1 || write_kib > 65536) {
    std::cerr << "bench_loopback_floor: --write-kib: expected 1 to 65536, got " << write_kib << "\n";
    return 2;
  }
  // A first, uncounted transfer: the first connection of a process pays for faults and
  // buffer growth that a round's long-lived connections have already paid.
  if (MeasureOnce(std::min<uint64_t>(static_cast<uint64_t>(bytes), 64u << 20), static_cast<size_t>(write_kib) * 1024) < 0) {
    std::cerr << "bench_loopback_floor: the transfer failed\n";
    return 1;
  }
  std::vector<double> seconds;
  for (int64_t i = 0; i < repeat; ++i) {
    const double s = MeasureOnce(static_cast<uint64_t>(bytes), static_cast<size_t>(write_kib) * 1024);
    if (s < 0) {
      std::cerr << "bench_loopback_floor: the transfer failed\n";
      return 1;
    }
    seconds.push_back(s);
    std::printf("run %lld: %.3f ms\n", static_cast<long long>(i + 1), s * 1e3);
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  std::printf("floor_bytes=%lld floor_ms=%.3f floor_gbps=%.3f\n", static_cast<long long>(bytes), median * 1e3,
              static_cast<double>(bytes) / median / 1e9);
  return 0;
}
