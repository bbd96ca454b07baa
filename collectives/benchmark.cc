// The collectives benchmark behind `tessera bench collectives` and bench_collectives: float32
// sum allreduce over loopback, ranks as forked processes.
//
//   tessera bench collectives [--ranks 2,4] [--backends p2p,gloo] [--min-bytes 4096]
//                     [--max-bytes 67108864] [--repeat 1] [--no-verify]
//   tessera bench collectives --tcp-ceiling [--json]
//   mpirun -np 2 bench_collectives --store-dir DIR [--backends mpi,p2p] [--max-bytes 4096]
//
// Sizes are multiples of 4 bytes (float32 elements). A flag that does not apply to the mode
// it is given in (--repeat under mpirun, a sweep flag with --tcp-ceiling) is an error.
//
// For each size: 10 warm-up iterations (fewer for the largest sizes), then timed ones; the
// reported time is the mean over timed iterations of the slowest rank, with rank 0's P95.
// algbw = bytes / time; busbw = algbw * 2(n-1)/n (the nccl-tests definitions). Every
// result is checked (sum of 1..n in every element).
//
// --repeat N runs the whole sweep N times, backends interleaved within each repetition (so a
// load change on a shared machine hits every backend alike), and ends with a table of the
// median busbw per size, backend and rank count.
//
// Call verification (CommunicatorOptions::verify_calls) is on, as in production; the header
// says so. --no-verify turns it off, to measure its cost on gloo and mpi.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "base/escape.h"
#include "base/flags.h"
#include "collectives/benchmark.h"
#include "collectives/registry.h"
#include "collectives/store/file_store.h"
#include "collectives/store/tcp_store.h"
#include "collectives/tcp_socket.h"

namespace tessera::collectives {
namespace {

struct BenchOptions {
  std::vector<int> ranks = {2, 4};
  std::vector<std::string> backends = {"p2p", "gloo"};
  size_t min_bytes = 4096;
  size_t max_bytes = 64u << 20;
  bool tcp_ceiling = false;
  bool verify_calls = true;
  int repeat = 1;
  bool json = false;      // one JSON object per measured row, no tables
  std::string store_dir;  // under mpirun
  int result_fd = -1;     // forked runs: rank 0 writes one SizeResult per size here
};

// One measured size, as rank 0 of a forked run reports it to the parent.
struct SizeResult {
  uint64_t bytes;
  double mean_seconds;
  double busbw;
};

std::vector<std::string> Split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(item);
  return out;
}

// One benchmark rank's communicator: a long timeout (64 MiB over loaded loopback is slow).
CommunicatorOptions BenchCommunicatorOptions(const std::string& backend, int rank, int size,
                                             const BenchOptions& options) {
  CommunicatorOptions comm;
  comm.backend = backend;
  comm.rank = rank;
  comm.size = size;
  comm.prefix = "bench";
  comm.timeout_ms = 120000;
  comm.verify_calls = options.verify_calls;
  return comm;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Runs the size sweep on one rank; rank 0 prints a row per size.
Status RunSweep(Communicator& c, const BenchOptions& options) {
  const int n = c.size();
  std::vector<float> send(options.max_bytes / sizeof(float), static_cast<float>(c.rank() + 1));
  std::vector<float> recv(send.size());
  const float expected = static_cast<float>(n * (n + 1) / 2);
  for (size_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 4) {
    const size_t count = bytes / sizeof(float);
    const int iterations =
        static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / bytes, 5, 100));
    const int warmup = std::min(10, iterations);
    for (int i = 0; i < warmup; ++i) {
      RETURN_IF_ERROR(c.Allreduce(send.data(), recv.data(), count, DataType::kFloat32,
                                  ReduceOp::kSum));
    }
    RETURN_IF_ERROR(c.Barrier());
    std::vector<double> samples;
    samples.reserve(iterations);
    const auto start = Clock::now();
    for (int i = 0; i < iterations; ++i) {
      const auto t0 = Clock::now();
      RETURN_IF_ERROR(c.Allreduce(send.data(), recv.data(), count, DataType::kFloat32,
                                  ReduceOp::kSum));
      samples.push_back(Seconds(Clock::now() - t0));
    }
    double mean = Seconds(Clock::now() - start) / iterations;
    RETURN_IF_ERROR(c.Allreduce(&mean, &mean, 1, DataType::kFloat64, ReduceOp::kMax));
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += recv[i] != expected;
    double wrong_total = static_cast<double>(wrong);
    RETURN_IF_ERROR(c.Allreduce(&wrong_total, &wrong_total, 1, DataType::kFloat64,
                                ReduceOp::kSum));
    std::sort(samples.begin(), samples.end());
    const double p95 = samples[std::min(samples.size() - 1, samples.size() * 95 / 100)];
    if (c.rank() == 0) {
      const double algbw = static_cast<double>(bytes) / mean / 1e9;
      const double busbw = algbw * 2.0 * (n - 1) / n;
      if (options.json) {
        std::printf("{\"backend\":\"%s\",\"ranks\":%d,\"bytes\":%zu,\"iterations\":%d,\"mean_us\":%.1f,"
                    "\"p95_us\":%.1f,\"algbw_gbps\":%.3f,\"busbw_gbps\":%.3f,\"correct\":%s}\n",
                    std::string(c.backend_name()).c_str(), n, bytes, iterations, mean * 1e6, p95 * 1e6, algbw,
                    busbw, wrong_total == 0 ? "true" : "false");
      } else {
        std::printf("%-6s %5d %12zu %6d %12.1f %12.1f %9.3f %9.3f  %s\n",
                    std::string(c.backend_name()).c_str(), n, bytes, iterations, mean * 1e6,
                    p95 * 1e6, algbw, busbw, wrong_total == 0 ? "ok" : "WRONG");
      }
      std::fflush(stdout);
      if (options.result_fd >= 0) {
        const SizeResult result{bytes, mean, busbw};
        if (::write(options.result_fd, &result, sizeof(result)) != sizeof(result)) {
          return InternalError("cannot report a result to the parent");
        }
      }
    }
    if (wrong_total != 0) return InternalError("allreduce results are wrong");
  }
  return Status::Ok();
}

void PrintHeader(const BenchOptions& options) {
  if (options.json) return;
  std::printf("# call verification (gloo, mpi, nccl): %s\n",
              options.verify_calls ? "on (verify_calls, the default)" : "off (--no-verify)");
  std::printf("%-6s %5s %12s %6s %12s %12s %9s %9s  %s\n", "backend", "ranks", "bytes", "iters",
              "mean_us", "p95_us", "algbw", "busbw", "check");
  std::printf("%-6s %5s %12s %6s %12s %12s %9s %9s\n", "", "", "", "", "", "", "GB/s", "GB/s");
  std::fflush(stdout);
}

// Forks `ranks` processes that rendezvous through a TcpStore served here. Appends rank 0's
// per-size results to `results`. Every failure of this process's own is said on stderr; a
// rank says its own.
int RunForked(const std::string& backend, int ranks, BenchOptions options,
              std::vector<SizeResult>* results) {
  const std::string run = "tessera bench collectives: " + backend + " with " + std::to_string(ranks) + " ranks";
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  if (!server.ok()) {
    std::fprintf(stderr, "%s: starting the store server: %s\n", run.c_str(), server.status().ToString().c_str());
    return 1;
  }
  const int port = (*server)->port();
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) {
    std::fprintf(stderr, "%s: pipe for rank 0's results: %s\n", run.c_str(), std::strerror(errno));
    return 1;
  }
  auto children = ForkChildren(ranks, [&](int rank) {
    ::close(pipe_fds[0]);
    if (rank != 0) ::close(pipe_fds[1]);
    options.result_fd = rank == 0 ? pipe_fds[1] : -1;
    auto store = TcpStore::Connect("127.0.0.1", port, std::chrono::seconds(10));
    if (!store.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, store.status().ToString().c_str());
      ::_exit(2);
    }
    auto c = CreateCommunicator(BenchCommunicatorOptions(backend, rank, ranks, options), *store);
    if (!c.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, c.status().ToString().c_str());
      ::_exit(3);
    }
    Status status = RunSweep(**c, options);
    if (!status.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, status.ToString().c_str());
    std::fflush(stdout);
    ::_exit(status.ok() ? 0 : 4);
  });
  ::close(pipe_fds[1]);
  if (!children.ok()) {
    ::close(pipe_fds[0]);
    std::fprintf(stderr, "%s: %s\n", run.c_str(), children.status().ToString().c_str());
    return 1;
  }
  SizeResult result;
  for (;;) {
    const ssize_t got = ::read(pipe_fds[0], &result, sizeof(result));
    if (got < 0 && errno == EINTR) continue;
    if (got != static_cast<ssize_t>(sizeof(result))) break;
    results->push_back(result);
  }
  ::close(pipe_fds[0]);
  const std::vector<std::string> failed = WaitForChildren(*children);
  for (const std::string& line : failed) std::fprintf(stderr, "%s: %s\n", run.c_str(), line.c_str());
  return failed.empty() ? 0 : 1;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

// One row per size; per rank count and backend: median busbw in GB/s (median time in us).
void PrintMedians(const BenchOptions& options,
                  const std::map<std::tuple<int, std::string, uint64_t>, std::vector<double>>& busbw,
                  const std::map<std::tuple<int, std::string, uint64_t>, std::vector<double>>& micros) {
  if (options.json) return;  // the rows say it all
  std::printf("\n== median over %d interleaved repetitions: busbw GB/s (time us)\n", options.repeat);
  std::printf("%12s", "bytes");
  for (int ranks : options.ranks) {
    for (const std::string& backend : options.backends) {
      std::printf(" %22s", (backend + " " + std::to_string(ranks) + "r").c_str());
    }
  }
  std::printf("\n");
  for (size_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 4) {
    std::printf("%12zu", bytes);
    for (int ranks : options.ranks) {
      for (const std::string& backend : options.backends) {
        const auto key = std::make_tuple(ranks, backend, uint64_t{bytes});
        const auto found = busbw.find(key);
        if (found == busbw.end()) {
          std::printf(" %22s", "-");
          continue;
        }
        char cell[64];
        std::snprintf(cell, sizeof(cell), "%.3f (%.1f)", Median(found->second),
                      Median(micros.at(key)));
        std::printf(" %22s", cell);
      }
    }
    std::printf("\n");
  }
  std::fflush(stdout);
}

// One sender process, one receiver: the bandwidth one loopback TCP stream reaches. A failure
// is said on stderr; the sender is reaped whatever happens.
int MeasureTcpCeiling(bool json) {
  const char* const what = "tessera bench collectives: --tcp-ceiling";
  auto listening = ListenTcp("127.0.0.1", 0, 1);
  if (!listening.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, listening.status().ToString().c_str());
    return 1;
  }
  const int port = listening->second;
  const size_t chunk = 4u << 20;
  const size_t total = size_t{4} << 30;
  auto sender = ForkChildren(1, [&](int) {
    auto socket = ConnectTcp("127.0.0.1", port, Clock::now() + std::chrono::seconds(10), "sink");
    if (!socket.ok()) ::_exit(1);
    (void)socket->Tune(0);
    std::vector<char> data(chunk, 1);
    for (size_t sent = 0; sent < total; sent += chunk) {
      if (!socket->SendAll(data.data(), chunk, Clock::now() + std::chrono::seconds(60), "sink").ok()) {
        ::_exit(1);
      }
    }
    ::_exit(0);
  });
  if (!sender.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, sender.status().ToString().c_str());
    return 1;
  }
  // Ends the sender (when it is still sending) and reaps it.
  auto fail = [&](const Status& status) {
    ::kill(sender->front(), SIGKILL);
    (void)WaitForChildren(*sender);
    std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
    return 1;
  };
  auto accepted = AcceptTcp(listening->first, Clock::now() + std::chrono::seconds(10));
  if (!accepted.ok()) return fail(accepted.status().WithContext("accepting the sender's connection"));
  std::vector<char> data(chunk);
  const auto start = Clock::now();
  for (size_t got = 0; got < total; got += chunk) {
    Status received = accepted->RecvAll(data.data(), chunk, Clock::now() + std::chrono::seconds(60), "source");
    if (!received.ok()) return fail(received);
  }
  const double seconds = Seconds(Clock::now() - start);
  const std::vector<std::string> failed = WaitForChildren(*sender);
  if (!failed.empty()) {
    std::fprintf(stderr, "%s: the sending process failed: %s\n", what, failed.front().c_str());
    return 1;
  }
  if (json) {
    std::printf("{\"tcp_ceiling_gbps\":%.3f,\"bytes\":%zu,\"seconds\":%.3f}\n",
                static_cast<double>(total) / seconds / 1e9, total, seconds);
  } else {
    std::printf("loopback TCP, one stream, 4 MiB writes: %.3f GB/s (%zu bytes in %.3f s)\n",
                static_cast<double>(total) / seconds / 1e9, total, seconds);
  }
  return 0;
}

// The rank and the world size mpirun gives each process it launches, checked as strictly as a
// flag: a value that is not a whole number, or one of the pair alone, is an error naming the
// variable. nullopt: not launched by mpirun.
struct MpiWorld {
  int size = 0;
  int rank = 0;
};

Result<std::optional<MpiWorld>> MpiWorldFromEnvironment() {
  const char* size_text = std::getenv("OMPI_COMM_WORLD_SIZE");
  const char* rank_text = std::getenv("OMPI_COMM_WORLD_RANK");
  if (size_text == nullptr && rank_text == nullptr) return std::optional<MpiWorld>();
  if (size_text == nullptr || rank_text == nullptr) {
    return InvalidArgumentError(std::string(size_text == nullptr ? "OMPI_COMM_WORLD_RANK" : "OMPI_COMM_WORLD_SIZE") +
                                " is set without " +
                                (size_text == nullptr ? "OMPI_COMM_WORLD_SIZE" : "OMPI_COMM_WORLD_RANK") +
                                ": expected both (mpirun sets them) or neither");
  }
  const auto parse = [](const char* variable, const char* text, long min, long max) -> Result<int> {
    char* end = nullptr;
    errno = 0;
    const long value = std::strtol(text, &end, 10);
    if (*text == '\0' || !std::isdigit(static_cast<unsigned char>(*text)) || *end != '\0' || errno == ERANGE ||
        value < min || value > max) {
      return InvalidArgumentError(std::string(variable) + ": expected " + std::to_string(min) + " to " +
                                  std::to_string(max) + ", got " + QuoteUntrusted(text));
    }
    return static_cast<int>(value);
  };
  MpiWorld world;
  ASSIGN_OR_RETURN(world.size, parse("OMPI_COMM_WORLD_SIZE", size_text, 1, 1 << 20));
  ASSIGN_OR_RETURN(world.rank, parse("OMPI_COMM_WORLD_RANK", rank_text, 0, world.size - 1));
  return std::optional<MpiWorld>(world);
}

}  // namespace

Result<std::vector<pid_t>> ForkChildren(int count, const std::function<void(int)>& body,
                                        const ForkFunction& fork_function,
                                        std::chrono::milliseconds lookup_wait) {
  auto paused = PauseHostLookups(std::chrono::steady_clock::now() + lookup_wait);
  if (!paused.ok()) {
    return paused.status().WithContext("not forking " + std::to_string(count) + " rank" + (count == 1 ? "" : "s"));
  }
  std::vector<pid_t> children;
  for (int i = 0; i < count; ++i) {
    const pid_t pid = fork_function();
    if (pid == 0) {
      paused->Resume();  // this process's own lookups
      body(i);
      ::_exit(1);
    }
    if (pid < 0) {
      const int error = errno;
      for (pid_t child : children) ::kill(child, SIGKILL);
      (void)WaitForChildren(children);
      return UnavailableError("fork for rank " + std::to_string(i) + " of " + std::to_string(count) + ": " +
                              std::strerror(error) + (children.empty() ? "" : "; the ranks forked before it were ended"));
    }
    children.push_back(pid);
  }
  return children;
}

std::vector<std::string> WaitForChildren(const std::vector<pid_t>& children, const WaitFunction& wait_function) {
  std::vector<std::string> failed;
  for (size_t rank = 0; rank < children.size(); ++rank) {
    const std::string who = "rank " + std::to_string(rank);
    int status = 0;
    pid_t waited = -1;
    do {
      waited = wait_function(children[rank], &status, 0);
    } while (waited < 0 && errno == EINTR);
    if (waited != children[rank]) {
      failed.push_back(who + " (pid " + std::to_string(children[rank]) + ") could not be waited for: " +
                       (waited < 0 ? std::strerror(errno) : "waitpid answered pid " + std::to_string(waited)));
    } else if (WIFSIGNALED(status)) {
      failed.push_back(who + " was killed by signal " + std::to_string(WTERMSIG(status)));
    } else if (!WIFEXITED(status)) {
      failed.push_back(who + " ended with wait status " + std::to_string(status));
    } else if (WEXITSTATUS(status) != 0) {
      failed.push_back(who + " exited with " + std::to_string(WEXITSTATUS(status)));
    }
  }
  return failed;
}

int CollectivesBenchmarkMain(int argc, char** argv) {
  BenchOptions options;
  std::string ranks = "2,4";
  std::string backends = "p2p,gloo";
  int64_t min_bytes = static_cast<int64_t>(options.min_bytes);
  int64_t max_bytes = static_cast<int64_t>(options.max_bytes);
  int64_t repeat = options.repeat;
  bool no_verify = false;
  bool help = false;
  FlagSet flags;
  flags.String("ranks", &ranks, "rank counts to run, comma-separated (1 to 64 each)");
  flags.String("backends", &backends, "backends to run, comma-separated (p2p, gloo, mpi, nccl)");
  flags.Int("min-bytes", &min_bytes, "the smallest message, bytes, a multiple of 4 (sizes grow by four)", IntRange{4, int64_t{1} << 30});
  flags.Int("max-bytes", &max_bytes, "the largest message, bytes, a multiple of 4", IntRange{4, int64_t{1} << 30});
  flags.Int("repeat", &repeat, "sweeps, backends interleaved within each; medians over them", IntRange{1, 100});
  flags.Bool("no-verify", &no_verify, "gloo, mpi, nccl: skip the per-call agreement check, to measure its cost");
  flags.Bool("tcp-ceiling", &options.tcp_ceiling, "measure one loopback TCP stream's bandwidth instead");
  flags.Bool("json", &options.json, "one JSON object per measured row instead of the tables");
  flags.String("store-dir", &options.store_dir,
               "under mpirun (and only there): a fresh directory every rank shares; --ranks is then mpirun's -np");
  flags.Bool("help", &help, "show this help");
  if (Status s = flags.ParseFlagsOnly(argc, argv); !s.ok()) {
    std::fprintf(stderr, "tessera bench collectives: %s\n", s.message().c_str());
    return 2;
  }
  if (help) {
    std::printf("Usage: tessera bench collectives [flags]\n\nAllreduce time, algbw and busbw over message sizes and "
                "rank counts, ranks as processes on\nloopback, every result checked.\n\nFlags:\n%s",
                flags.Usage().c_str());
    return 0;
  }
  if (!flags.positional().empty()) {
    std::fprintf(stderr, "tessera bench collectives: takes no arguments, only flags (see --help)\n");
    return 2;
  }
  // Messages are float32 elements: a size that is not a multiple of four would move fewer
  // bytes than its row reports.
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"min-bytes", min_bytes},
                                    std::pair<const char*, int64_t>{"max-bytes", max_bytes}}) {
    if (value % 4 != 0) {
      std::fprintf(stderr, "tessera bench collectives: flag --%s: expected a multiple of 4 (float32 elements), got %lld\n",
                   name, static_cast<long long>(value));
      return 2;
    }
  }
  if (min_bytes > max_bytes) {
    std::fprintf(stderr, "tessera bench collectives: flag --min-bytes: expected at most --max-bytes (%lld), got %lld\n",
                 static_cast<long long>(max_bytes), static_cast<long long>(min_bytes));
    return 2;
  }
  auto rank_counts = ParseIntListFlag("ranks", ranks, IntRange{1, 64});
  if (!rank_counts.ok()) {
    std::fprintf(stderr, "tessera bench collectives: %s\n", rank_counts.status().message().c_str());
    return 2;
  }
  options.ranks.clear();
  for (const int64_t count : *rank_counts) options.ranks.push_back(static_cast<int>(count));
  options.backends = Split(backends);
  for (const auto& b : options.backends) {
    if (b != "p2p" && b != "gloo" && b != "mpi" && b != "nccl") {
      std::fprintf(stderr, "tessera bench collectives: flag --backends: expected p2p, gloo, mpi or nccl, got '%s'\n",
                   EscapeUntrusted(b, 32).c_str());
      return 2;
    }
  }
  if (options.ranks.empty() || options.backends.empty()) {
    std::fprintf(stderr, "tessera bench collectives: --ranks and --backends need at least one value each\n");
    return 2;
  }
  options.min_bytes = static_cast<size_t>(min_bytes);
  options.max_bytes = static_cast<size_t>(max_bytes);
  options.repeat = static_cast<int>(repeat);
  options.verify_calls = !no_verify;
  if (options.tcp_ceiling) {
    // One TCP stream between two processes: no sweep, so the sweep's flags would be ignored.
    for (const char* sweep : {"ranks", "backends", "min-bytes", "max-bytes", "repeat", "no-verify", "store-dir"}) {
      if (flags.WasGiven(sweep)) {
        std::fprintf(stderr, "tessera bench collectives: --%s does not apply to --tcp-ceiling, which measures one "
                             "loopback TCP stream and runs no sweep\n", sweep);
        return 2;
      }
    }
    return MeasureTcpCeiling(options.json);
  }

  auto world = MpiWorldFromEnvironment();
  if (!world.ok()) {
    std::fprintf(stderr, "tessera bench collectives: %s\n", world.status().message().c_str());
    return 2;
  }
  if (world->has_value()) {  // launched by mpirun
    if (options.store_dir.empty()) {
      std::fprintf(stderr, "tessera bench collectives: under mpirun, pass --store-dir (a fresh shared directory)\n");
      return 2;
    }
    if (flags.WasGiven("ranks")) {
      std::fprintf(stderr, "tessera bench collectives: --ranks is for ranks forked here; under mpirun the rank count "
                           "is mpirun's (OMPI_COMM_WORLD_SIZE is %d)\n", (*world)->size);
      return 2;
    }
    if (repeat > 1) {
      std::fprintf(stderr, "tessera bench collectives: --repeat is for ranks forked here; under mpirun each backend's "
                           "sweep runs once (run mpirun again to repeat it)\n");
      return 2;
    }
    auto store = FileStore::Open(options.store_dir);
    if (!store.ok()) {
      std::fprintf(stderr, "tessera bench collectives: --store-dir %s: %s\n",
                   QuoteUntrusted(options.store_dir, 256).c_str(), store.status().message().c_str());
      return 2;
    }
    const int rank = (*world)->rank;
    if (rank == 0) PrintHeader(options);
    for (const std::string& backend : options.backends) {
      auto c = CreateCommunicator(BenchCommunicatorOptions(backend, rank, (*world)->size, options), *store);
      if (!c.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, c.status().ToString().c_str());
        return 1;
      }
      Status status = RunSweep(**c, options);
      if (!status.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, status.ToString().c_str());
        return 1;
      }
    }
    return 0;
  }
  if (!options.store_dir.empty()) {
    std::fprintf(stderr, "tessera bench collectives: --store-dir is for ranks launched by mpirun, and "
                         "OMPI_COMM_WORLD_SIZE is unset: the ranks forked here need no store directory\n");
    return 2;
  }

  PrintHeader(options);
  int failures = 0;
  // busbw samples per (ranks, backend, bytes), one per repetition.
  std::map<std::tuple<int, std::string, uint64_t>, std::vector<double>> busbw;
  std::map<std::tuple<int, std::string, uint64_t>, std::vector<double>> micros;
  for (int repetition = 0; repetition < options.repeat; ++repetition) {
    for (int ranks : options.ranks) {
      for (const std::string& backend : options.backends) {
        std::vector<SizeResult> results;
        failures += RunForked(backend, ranks, options, &results);
        for (const SizeResult& r : results) {
          busbw[{ranks, backend, r.bytes}].push_back(r.busbw);
          micros[{ranks, backend, r.bytes}].push_back(r.mean_seconds * 1e6);
        }
      }
    }
  }
  if (options.repeat > 1) PrintMedians(options, busbw, micros);
  return failures == 0 ? 0 : 1;
}

}  // namespace tessera::collectives
