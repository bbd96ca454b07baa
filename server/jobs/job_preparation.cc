// How a job's runner starts or resumes (server/jobs/job_runner.h): the global model and the
// strategy's state from the job's newest usable checkpoint (or a fresh initial model), the
// parties' sizes from the operator's copy of the training set, the seats that fit the job,
// and what client selection learned from the rounds already committed.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "base/escape.h"
#include "proto/job_mapping.h"
#include "server/jobs/job_runner.h"

namespace tessera::server {

Status JobRunner::Prepare() {
  v1::Job job = Snapshot();
  const v1::JobSpec& spec = job.spec();
  ASSIGN_OR_RETURN(evaluator_, Evaluator::Create(spec, options_.Datasets(), "job " + job.id(), options_.evaluation_threads,
                                                    options_.evaluation_device));
  RETURN_IF_ERROR(LoadPartySizes(spec));
  TensorSet global;
  TensorSet strategy_state;
  TensorSet selection_state;
  uint32_t rewound_from = 0;  // the job's committed rounds before a fallback to an older checkpoint
  if (job.rounds_committed() == 0) {
    auto initial = store_->LoadCheckpoint(job.id(), 0);
    if (initial.ok()) {
      global = SplitModelAndState(std::move(initial).value(), &strategy_state, &selection_state);
    } else if (initial.status().code() == StatusCode::kNotFound || initial.status().code() == StatusCode::kDataLoss) {
      // No round was committed from it: a missing or damaged initial model is made again.
      if (initial.status().code() == StatusCode::kDataLoss) {
        spdlog::warn("job {}: {}; making the initial model again", job.id(), initial.status().message());
        Note("initial model not usable, made again: " + initial.status().message());
      }
      ASSIGN_OR_RETURN(global, evaluator_->InitialModel());
      RETURN_IF_ERROR(store_->SaveInitialModel(job.id(), global));
    } else {
      return initial.status();
    }
  } else {
    std::vector<Status> damaged;
    ASSIGN_OR_RETURN(StateStore::Checkpoint checkpoint,
                     store_->LoadNewestCheckpoint(job.id(), job.rounds_committed(), &damaged));
    for (const Status& why : damaged) {
      spdlog::warn("job {}: {}", job.id(), why.message());
      Note("checkpoint not usable: " + why.message());
    }
    if (checkpoint.round < job.rounds_committed()) {
      // The newest checkpoints are damaged: the job goes back to the round of the newest
      // good one, and the rounds after it are run again. The store moves back only once
      // that checkpoint has passed the checks below (its strategy's state, its model against
      // its round's record): one refused fails the job with its rounds as they were.
      rewound_from = job.rounds_committed();
      ASSIGN_OR_RETURN(auto rounds, store_->ListRounds(job.id(), checkpoint.round, /*max_bytes=*/0));  // its record only
      job.set_rounds_committed(checkpoint.round);
      job.clear_last_round();
      if (checkpoint.round > 0 && !rounds.empty() && rounds.front().round() == checkpoint.round) {
        *job.mutable_last_round() = rounds.front();
      }
    }
    global = SplitModelAndState(std::move(checkpoint.tensors), &strategy_state, &selection_state);
    spdlog::info("job {}: resuming after round {} from its checkpoint", job.id(), job.rounds_committed());
  }
  RETURN_IF_ERROR(evaluator_->CheckFits(global).WithContext("job " + job.id() + " checkpoint"));
  if (options_.strategy_factory) {
    ASSIGN_OR_RETURN(strategy_, options_.strategy_factory(spec, global));
  } else {
    ASSIGN_OR_RETURN(strategy_, CreateStrategy(spec, global, evaluator_->BufferNames()));
  }
  non_negative_ = BufferMask(global, evaluator_->NonNegativeNames());
  // A committed round of a strategy that keeps state wrote that state beside its model: a
  // checkpoint without it (its tensors cut out of the file, with the manifest) would start the
  // strategy afresh in the middle of the job, its momentum or control variates lost.
  if (job.rounds_committed() > 0 && strategy_state.empty() && !strategy_->state().empty()) {
    return DataLossError("job " + job.id() + " checkpoint of round " + std::to_string(job.rounds_committed()) +
                         ": it holds no " + std::string(strategy_->name()) + " state; expected its " +
                         std::to_string(strategy_->state().size()) + " tensors named '" +
                         std::string(kStrategyStatePrefix) + "...'");
  }
  RETURN_IF_ERROR(strategy_->Restore(std::move(strategy_state))
                      .WithContext("job " + job.id() + " checkpoint of round " + std::to_string(job.rounds_committed())));
  std::vector<Status> dropped_seats;
  RETURN_IF_ERROR(seats_.Load(SeatedParties(spec), &dropped_seats));
  for (const Status& why : dropped_seats) {
    spdlog::warn("{}", why.message());
    Note(why.message());
  }
  RETURN_IF_ERROR(RestoreSelectionHistory(job, selection_state));
  update_sets_ = 1 + strategy_->PayloadSets().size();
  int64_t bytes = 0;
  for (const auto& t : global) bytes += static_cast<int64_t>(t.ByteSize());
  // Encoded (hashed and cut into chunks) before the runner's lock is taken: readers of its
  // state do not wait for a large model.
  auto encoded = ModelVersion::Encode(std::make_shared<const TensorSet>(std::move(global)), job.rounds_committed(),
                                      options_.chunk_bytes, wire::JobDownloadEncoding(job.spec()), non_negative_);
  // The committed round's record names its model by its hash. Each checkpoint file checks its
  // tensors only against its own manifest: one of another round or job put in its place loads,
  // and would go on from the wrong model.
  const v1::RoundRecord& last = job.last_round();
  if (job.rounds_committed() > 0 && last.round() == job.rounds_committed() && !last.model_sha256().empty() &&
      encoded->sha256() != last.model_sha256()) {
    return DataLossError("job " + job.id() + " checkpoint of round " + std::to_string(job.rounds_committed()) +
                         ": its model's SHA-256 is " + encoded->sha256() + "; expected " +
                         QuoteUntrusted(last.model_sha256(), 64) + ", the round record's field 'model_sha256'");
  }
  if (rewound_from > job.rounds_committed()) {
    const std::string message = "falling back to the checkpoint of round " + std::to_string(job.rounds_committed()) +
                                "; rounds " + std::to_string(job.rounds_committed() + 1) + " to " +
                                std::to_string(rewound_from) + " will be run again";
    spdlog::warn("job {}: {}", job.id(), message);
    RETURN_IF_ERROR(store_->RewindJob(job));
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_.set_rounds_committed(job.rounds_committed());
      *job_.mutable_last_round() = job.last_round();
    }
    // A note that says, besides, which rounds are gone: a watch sends them again as they are
    // run again (server/rpc/job_service.cc), and its watcher forgets those it showed.
    v1::JobEvent event;
    *event.mutable_job() = Summary();
    event.set_message(message);
    v1::JobRewind* rewind = event.mutable_rewind();
    rewind->set_to_round(job.rounds_committed());
    rewind->set_from_round(rewound_from);
    rewind->set_at_unix_ms(UnixMillis());
    events_.Publish(std::move(event));
  }
  std::lock_guard<std::mutex> lock(mu_);
  model_bytes_ = static_cast<uint64_t>(bytes);
  current_ = std::move(encoded);
  return Status::Ok();
}

Status JobRunner::RestoreSelectionHistory(const v1::Job& job, const TensorSet& checkpointed) {
  if (!selection_->LearnsFromRounds() || job.rounds_committed() == 0) return Status::Ok();
  const uint32_t committed = job.rounds_committed();
  ClientHistory* const learned = selection_->learned();
  if (learned != nullptr && !checkpointed.empty()) {
    // What the policy knew when the round was committed, all of it, as an uninterrupted job's
    // policy knows it now.
    const std::string source = "job " + job.id() + " checkpoint of round " + std::to_string(committed);
    Result<ClientHistory> history = DataLossError(source + ": tensor '" + std::string(ClientHistory::kTensorName) +
                                                  "': expected it to be the checkpoint's one selection tensor");
    if (checkpointed.size() == 1 && checkpointed[0].name == ClientHistory::kTensorName) {
      history = ClientHistory::FromTensor(checkpointed[0], source);
    }
    if (history.ok()) {
      *learned = std::move(history).value();
      spdlog::info("job {}: client selection knows {} clients from its checkpoint", job.id(), learned->clients());
      return Status::Ok();
    }
    // It only steers which clients are asked: the records in the store teach it again.
    spdlog::warn("job {}: {}; learning from the committed rounds' records instead", job.id(),
                 history.status().message());
    Note("selection history not usable, learned again from the round records: " + history.status().message());
  }
  // A checkpoint written before checkpoints carried the history: the records of the newest
  // rounds teach it, from nothing (a Prepare tried again observes no round twice).
  if (learned != nullptr) *learned = ClientHistory();
  ASSIGN_OR_RETURN(auto newest, store_->ListRounds(job.id(), committed, /*max_bytes=*/0));  // its record only
  const uint64_t record_bytes = newest.empty() ? 1 : std::max<uint64_t>(1, newest.front().ByteSizeLong());
  const uint64_t window = std::min<uint64_t>(
      committed, std::max<uint64_t>(kSelectionHistoryRounds, kSelectionHistoryBytes / record_bytes));
  uint32_t from = static_cast<uint32_t>(committed - window + 1);
  size_t observed = 0;
  while (from <= committed) {
    ASSIGN_OR_RETURN(auto page, store_->ListRounds(job.id(), from, kSelectionHistoryPageBytes));
    if (page.empty()) break;
    for (const v1::RoundRecord& record : page) {
      if (record.round() > committed) break;
      selection_->Observe(record, job.spec());
      ++observed;
    }
    // Pages move forward only: a record at or past the last committed round ends the history
    // (one numbered 2^32 - 1 would wrap `from` to 0 and read the pages again for ever), and
    // so does one behind the page's start.
    const uint32_t last = page.back().round();
    if (last >= committed || last < from) break;
    from = last + 1;
  }
  spdlog::info("job {}: client selection learned from {} committed rounds", job.id(), observed);
  return Status::Ok();
}

Status JobRunner::LoadPartySizes(const v1::JobSpec& spec) {
  party_sizes_.clear();
  if (spec.data().partition().kind() == v1::PARTITION_LOCAL_FILES) return Status::Ok();
  // The same split the workers compute, from the operator's copy of the training labels.
  const std::string what = "job " + job_.id() + ": the partition of the operator's training set";
  auto labels = LoadTrainingLabels(options_.Datasets(), spec);
  if (!labels.ok()) return labels.status().WithContext(what);
  auto parts = wire::PartitionTrainingSet(spec, std::move(labels).value());
  if (!parts.ok()) return parts.status().WithContext(what);
  for (const auto& part : *parts) party_sizes_.push_back(part.size());
  return Status::Ok();
}

uint64_t JobRunner::MaxSamples(uint32_t party) const {
  if (party_sizes_.empty()) return wire::kMaxLocalFilesSamples;  // workers' own files: unknown here
  return party < party_sizes_.size() ? party_sizes_[party] : 0;
}

}  // namespace tessera::server
