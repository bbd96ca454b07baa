// A SIGTERM reaches the shutdown waiter even when a thread started before the signals were
// blocked (as OpenBLAS's pool is, from its constructor) is the one the kernel picks.
#include "base/shutdown_signal.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <condition_variable>
#include <mutex>
#include <thread>

namespace tessera {
namespace {

TEST(ShutdownSignalTest, ASignalTakenByAThreadThatDoesNotBlockItStillReachesTheWaiter) {
  ASSERT_TRUE(InstallShutdownSignalHandlers().ok());
  // A library's thread, started with the signals unblocked, parked for the whole test.
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread library_thread([&] {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
  });
  // main() then blocks them for its own threads, as the daemons do.
  sigset_t set, previous;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, &previous);
  ::kill(::getpid(), SIGTERM);  // the library thread is the only one that can take it now
  int received = -1;
  std::thread waiter([&] { received = WaitForShutdownSignal(); });
  waiter.join();
  EXPECT_EQ(received, SIGTERM);
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
  library_thread.join();
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

TEST(ShutdownSignalTest, WakingTheWaiterReturnsZero) {
  ASSERT_TRUE(InstallShutdownSignalHandlers().ok());
  int received = -1;
  std::thread waiter([&] { received = WaitForShutdownSignal(); });
  WakeShutdownWaiter();
  waiter.join();
  EXPECT_EQ(received, 0);
}

}  // namespace
}  // namespace tessera
