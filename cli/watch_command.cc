// `tessera watch`: a job's rounds as they commit, its notes and progress, then a summary.
//
// A watch may follow a job of up to wire::kMaxRounds rounds for days, so it keeps nothing of a
// round once its row is printed but what the summary needs: twelve latencies a round
// (PhaseLatencies), not the round's record with its workers' reports. The notes it has shown
// are remembered by hash with how many times each was shown, and only the latest of them
// (NoteCounts).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <ostream>
#include <thread>
#include <unordered_map>
#include <utility>

#include "base/escape.h"
#include "cli/client_text.h"
#include "cli/job_client.h"
#include "proto/grpc_status.h"
#include "proto/job_mapping.h"
#include "proto/json.h"

namespace tessera::cli {
namespace {

// How many times each of the latest notes was seen, so that those a reconnected watch is sent
// again (the coordinator replays its live log, at most its last 1,000 events:
// server/jobs/job_events.h) are not shown twice, while a note that happens again (a worker
// refused for the same reason in another round) is shown again. A note seen counts as seen
// anew, so that the last kCapacity distinct notes are remembered: every note a replay can
// hold. Kept as 64-bit hashes with a count, a few dozen bytes a note whatever its length.
class NoteCounts {
 public:
  static constexpr size_t kCapacity = 4096;

  // The count of the note hashed to `hash` (0 when it is not remembered), which the caller may
  // change; it becomes the latest note, the oldest being forgotten to make room.
  uint32_t& At(uint64_t hash) {
    if (auto it = index_.find(hash); it != index_.end()) {
      order_.splice(order_.end(), order_, it->second.first);
      return it->second.second;
    }
    if (order_.size() == kCapacity) {
      index_.erase(order_.front());
      order_.pop_front();
    }
    auto& entry = index_[hash];
    entry = {order_.insert(order_.end(), hash), 0};
    return entry.second;
  }

 private:
  std::list<uint64_t> order_;  // oldest first
  std::unordered_map<uint64_t, std::pair<std::list<uint64_t>::iterator, uint32_t>> index_;
};

// The names the coordinator says a round waits on, at most the first 8 of them (as many as it
// sends): "a, b, c and 4 more".
std::string WaitingOn(const v1::RoundProgress& p) {
  constexpr int kShown = 8;
  std::string waiting;
  for (int i = 0; i < p.waiting_on_size() && i < kShown; ++i) {
    waiting += (waiting.empty() ? "" : ", ") + Shown(p.waiting_on(i), kShownNameChars);
  }
  const uint64_t more = uint64_t{p.waiting_more()} + static_cast<uint64_t>(std::max(0, p.waiting_on_size() - kShown));
  if (more > 0) waiting += Format(" and %llu more", static_cast<unsigned long long>(more));
  return waiting;
}

}  // namespace

Status WatchCommand(v1::JobService::StubInterface& stub, const std::string& job_id, std::ostream& out,
                    const WatchOptions& options) {
  const bool json = options.print.json;
  PhaseLatencies latencies;  // of the rounds shown, for the summary
  v1::RoundRecord last_round;  // the last round shown, without its workers
  NoteCounts shown_notes;  // how many times each note was shown, over every stream
  v1::Job last_job;
  bool header_done = false;
  uint32_t next_round = 0;
  // Lost since lost_since: no stream since then has shown a new round or a new note, nor sent
  // events and stayed open for options.steady_for. A coordinator that answers and then closes each stream at once
  // (cleanly or not) is no more back than one that does not answer: its reconnects count toward
  // options.reconnect_for together.
  bool lost = false;
  bool answered = false;  // the coordinator has sent an event: a stream that fails later lost it
  bool progress_shown = false;  // a live progress line is on screen, without its newline
  std::chrono::steady_clock::time_point lost_since{};
  auto backoff = std::chrono::milliseconds(250);
  for (;;) {
    const auto opened = std::chrono::steady_clock::now();
    bool moved_on = false;  // this stream showed a new round or a new note
    bool reconnected = false;  // this stream sent an event while the coordinator was lost
    grpc::ClientContext ctx;
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    request.set_from_round(next_round);
    auto reader = stub.WatchJob(&ctx, request);
    NoteCounts stream_notes;  // how many times each note came in this stream
    v1::JobEvent event;
    while (reader->Read(&event)) {
      answered = true;
      if (lost && !reconnected) {
        if (!json) out << "  reconnected to the coordinator" << std::endl;
        reconnected = true;
      }
      last_job = event.job();
      if (event.has_progress()) {
        const auto& p = event.progress();
        if (p.round() < next_round) continue;  // a round shown already (replayed after a reconnect)
        if (json) {
          out << wire::ToJson(event) << std::endl;
          continue;
        }
        const std::string waiting = WaitingOn(p);
        // An asynchronous job's progress is its open buffer: updates folded of the step's K,
        // and the clients training.
        const std::string line =
            event.job().spec().has_async()
                ? Format("  step %u: %u/%u updates buffered, training: %s", p.round(), p.reported(), p.selected(),
                         waiting.empty() ? "nobody" : waiting.c_str())
                : Format("  round %u: %u/%u reported, waiting on %s (%.0f s to the deadline)", p.round(),
                         p.reported(), p.selected(), waiting.c_str(), p.deadline_in_ms() / 1000);
        if (options.live) {
          out << "\r\033[K" << line << std::flush;
          progress_shown = true;
        } else {
          out << line << std::endl;
        }
        continue;
      }
      if (progress_shown) {
        out << "\r\033[K";  // the live progress line gives way
        progress_shown = false;
      }
      if (event.has_round()) {
        if (event.round().round() < next_round) continue;  // shown before the coordinator restarted
        if (event.round().round() > wire::kMaxRounds) {
          return InvalidArgumentError("job " + job_id + ": the coordinator sent round " +
                                      std::to_string(event.round().round()) + ", past the most a job has (" +
                                      std::to_string(wire::kMaxRounds) + ")");
        }
        next_round = event.round().round() + 1;
        moved_on = true;
        latencies.Add(event.round().latency());
        last_round.set_round(event.round().round());
        last_round.set_test_accuracy(event.round().test_accuracy());
        if (event.round().has_async_step()) {
          last_round.mutable_async_step();
        } else {
          last_round.clear_async_step();
        }
      } else if (!event.message().empty()) {
        // The n-th time a stream sends a note is shown if no stream showed it n times before:
        // a replay's notes were shown, a note that happens again was not. A rewind is told
        // from another to the same rounds by its time.
        const uint64_t hash = std::hash<std::string>()(
            event.has_rewind() ? event.message() + "\n" + std::to_string(event.rewind().at_unix_ms()) : event.message());
        const uint32_t here = ++stream_notes.At(hash);
        uint32_t& shown = shown_notes.At(hash);
        if (here <= shown) continue;
        shown = here;
        moved_on = true;
        // The job moved back to an older checkpoint: the rounds after it that were shown are
        // gone, and the coordinator sends them as they are run again.
        if (event.has_rewind() && event.rewind().to_round() < next_round) next_round = event.rewind().to_round() + 1;
      }
      if (json) {
        out << wire::ToJson(event) << std::endl;
      } else if (event.has_round()) {
        const bool async = event.round().has_async_step();
        if (!header_done) {
          out << (async ? AsyncStepHeader() : RoundHeader()) << "\n";
          header_done = true;
        }
        out << (async ? AsyncStepRow(event.round()) : RoundRow(event.round())) << std::endl;
      } else if (event.has_rewind()) {
        const v1::JobRewind& r = event.rewind();
        const uint64_t first = uint64_t{r.to_round()} + 1;
        out << "  job moved back to round " << r.to_round() << ": the checkpoint of round " << r.from_round()
            << " was missing or damaged; "
            << (first >= r.from_round() ? Format("round %llu runs", static_cast<unsigned long long>(first))
                                         : Format("rounds %llu to %u run", static_cast<unsigned long long>(first),
                                                  r.from_round()))
            << " again" << std::endl;
      } else if (!event.message().empty()) {
        out << "  " << Shown(event.message(), kShownTextChars) << std::endl;
      }
    }
    Status finished = wire::FromGrpc(reader->Finish(), "watch " + job_id);
    if (wire::JobEnded(last_job.state())) break;
    // The stream ended before the job did: the coordinator stopped or cannot be reached.
    // Anything else (no such job, not allowed) is final.
    if (!finished.ok() && finished.code() != StatusCode::kUnavailable && finished.code() != StatusCode::kCancelled) {
      return finished;
    }
    // No coordinator has answered yet (a mistyped address, a TLS setup it refuses): that is
    // said now, as every other command says it, not after reconnect_for.
    if (!finished.ok() && !answered) return finished;
    const auto now = std::chrono::steady_clock::now();
    if (progress_shown) {
      out << "\n";
      progress_shown = false;
    }
    if (lost && (moved_on || (reconnected && now - opened >= options.steady_for))) {
      lost = false;  // the coordinator came back: a loss now is a new one
      backoff = std::chrono::milliseconds(250);
    }
    if (!lost) {
      lost = true;
      lost_since = now;
      if (!json) out << "  lost the coordinator; reconnecting for up to " << options.reconnect_for.count() / 1000
                     << " s (it resumes the job when it restarts)" << std::endl;
    } else if (now - lost_since >= options.reconnect_for) {
      return UnavailableError("job " + job_id + ": the coordinator did not come back within " +
                              std::to_string(options.reconnect_for.count() / 1000) + " s" +
                              (finished.ok() ? std::string() : " (" + finished.message() + ")"));
    } else if (reconnected && !json) {
      const auto left = std::chrono::duration_cast<std::chrono::seconds>(options.reconnect_for - (now - lost_since));
      out << "  lost the coordinator again before it sent a new round or note; reconnecting for up to "
          << left.count() << " s more" << std::endl;
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
  if (progress_shown) out << "\r\033[K";
  if (latencies.rounds() > 0 && !json) {
    const bool async = last_round.has_async_step();
    const char* unit = async ? "steps" : "rounds";
    out << "\nfinal test accuracy: " << Format("%.2f%%", 100 * last_round.test_accuracy()) << " after "
        << last_round.round() << " " << unit << "\n\n" << (async ? "step" : "round") << " latency by phase ("
        << latencies.rounds() << " " << unit << "):\n" << latencies.Summary();
  }
  if (last_job.state() == v1::JOB_FAILED || last_job.state() == v1::JOB_CANCELLED) {
    return FailedPreconditionError("job " + job_id + " " + StateName(last_job.state()) +
                                   (last_job.error().empty() ? "" : ": " + Shown(last_job.error(), kShownTextChars)));
  }
  return Status::Ok();
}

}  // namespace tessera::cli
