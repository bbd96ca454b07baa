// SIGINT and SIGTERM turned into an orderly shutdown, whichever thread the kernel picks.
//
// Why not block the signals in main() and sigwait() for them: that covers only the threads
// main() starts. A library can start threads before main() (OpenBLAS starts its thread pool
// from its constructor when it is loaded), and those threads have the signals unblocked, so
// the kernel delivers a process-directed SIGTERM to one of them and its default action kills
// the process without draining. Here every thread may take the signal: a handler, installed
// for the whole process, writes the signal's number to a pipe (async-signal-safe; it never
// blocks), and a waiting thread reads it.
//
// Use: InstallShutdownSignalHandlers() first thing in main(); optionally block the signals
// in main() before starting threads (so that they do not interrupt the daemon's own threads),
// and call WaitForShutdownSignal() on one thread: it unblocks the signals for itself, so some
// thread always takes them.
#pragma once

#include "base/status.h"

namespace tessera {

// Installs the handlers for SIGINT and SIGTERM (SA_RESTART). Idempotent. An error when the
// pipe cannot be made or sigaction fails.
Status InstallShutdownSignalHandlers();

// Blocks SIGINT and SIGTERM in the calling thread (and the threads it starts from now on).
void BlockShutdownSignals();

// Blocks until SIGINT or SIGTERM arrives (returns its number) or WakeShutdownWaiter() is
// called (returns 0). Unblocks both signals in the calling thread first. Returns at once for
// a signal that arrived before it was called.
int WaitForShutdownSignal();

// Lets a WaitForShutdownSignal() return 0: the daemon is stopping for its own reasons.
void WakeShutdownWaiter();

}  // namespace tessera
