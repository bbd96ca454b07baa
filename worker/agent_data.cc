// The worker's data: its party's share of the training split and its local test split, loaded
// once per job and party and kept while the job runs (WorkerAgent, worker/agent.h).
#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
#include <set>

#include <spdlog/spdlog.h>
#ifdef __GLIBC__
#include <malloc.h>  // malloc_trim
#endif

#include "base/escape.h"
#include "core/data/dataset_source.h"
#include "core/data/idx.h"
#include "core/data/partition.h"
#include "proto/job_mapping.h"
#include "worker/agent.h"

namespace tessera::worker {

namespace {

// The files a split's labels are read from, for errors about them.
std::string LabelFiles(const DataSource& source, bool train) {
  auto files = SplitFiles(source, train);
  if (!files.ok() || files->empty()) return source.dir;
  // An idx split's labels have a file of their own, after its images.
  if (source.format == DataFormat::kIdx) return files->back();
  std::string joined;
  for (const std::string& file : *files) joined += (joined.empty() ? "" : ", ") + file;
  return joined;
}

}  // namespace

Result<std::vector<int64_t>> WorkerAgent::PartyRows(const v1::TrainTask& task, const std::string& labels_from,
                                                    const std::function<Result<std::vector<uint8_t>>()>& read_labels) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = partitions_.find(task.job_id());
  if (it == partitions_.end()) {
    lock.unlock();
    ASSIGN_OR_RETURN(std::vector<uint8_t> labels, read_labels());
    auto partitioned = wire::PartitionTrainingSet(task.spec(), std::move(labels));
    if (!partitioned.ok()) return partitioned.status().WithContext(labels_from);
    auto parts = std::move(partitioned).value();
    lock.lock();
    partitions_.clear();  // one job's partition at a time
    it = partitions_.emplace(task.job_id(), std::move(parts)).first;
  }
  if (task.party_index() >= it->second.size()) {
    return InvalidArgumentError("task for party " + std::to_string(task.party_index()) + ", but the partition has " +
                                std::to_string(it->second.size()) + " parties");
  }
  return it->second[task.party_index()];
}

Result<std::shared_ptr<const Dataset>> WorkerAgent::TrainingShare(const v1::TrainTask& task) {
  const v1::JobSpec& spec = task.spec();
  const bool local = spec.data().partition().kind() == v1::PARTITION_LOCAL_FILES;
  if (local && options_.data_dir.empty()) {
    return FailedPreconditionError("the job trains on each worker's own files, but this worker has no --data-dir");
  }
  const std::string dir = local ? options_.data_dir : wire::DatasetDirectory(spec);
  // A local share depends on everything the job says of its data (format, label column,
  // normalisation, classes, the cut): two jobs on one --data-dir that differ in any of it must
  // not share a load. A partition's share is the job's and the party's.
  const std::string key = dir + "#" + std::to_string(spec.data().max_train_samples()) +
                          (local ? "#" + spec.data().SerializeAsString()
                                 : "#" + task.job_id() + "#" + std::to_string(task.party_index()));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (share_ && share_key_ == key) {
      share_job_ = task.job_id();  // the job using it now: its end releases it
      return share_;
    }
  }
  std::shared_ptr<const Dataset> share;
  const bool fashion = wire::IsFashionMnist(spec);
  if (!fashion && !local && spec.data().path().empty()) {
    return FailedPreconditionError("data.path: the job's dataset \"" + spec.data().dataset() +
                                   "\" needs the workers' directory of it in data.path");
  }
  const int classes = wire::DatasetClasses(spec);
  if (local && !fashion) {
    // The worker's own files, in the job's format, are all its share.
    ASSIGN_OR_RETURN(DataSource source, wire::ToDataSource(spec, dir));
    ASSIGN_OR_RETURN(DataShape shape, InspectSplit(source, /*train=*/true));
    int64_t count = shape.count;
    if (spec.data().max_train_samples() > 0) count = std::min<int64_t>(count, spec.data().max_train_samples());
    std::vector<int64_t> rows(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) rows[static_cast<size_t>(i)] = i;
    ASSIGN_OR_RETURN(Dataset data, LoadSplitRows(source, /*train=*/true, rows, classes));
    share = std::make_shared<const Dataset>(std::move(data));
  } else if (local) {
    // The worker's own files are all its share.
    ASSIGN_OR_RETURN(Dataset data, LoadFashionMnist(dir, /*train=*/true, wire::FashionNormalisation(spec)));
    if (spec.data().max_train_samples() > 0) data = TakeFirst(data, spec.data().max_train_samples());
    share = std::make_shared<const Dataset>(std::move(data));
  } else if (!fashion) {
    // The partition needs every label; only this party's samples are converted and kept.
    ASSIGN_OR_RETURN(DataSource source, wire::ToDataSource(spec, dir));
    ASSIGN_OR_RETURN(std::vector<int64_t> rows,
                     PartyRows(task, LabelFiles(source, /*train=*/true),
                               [&] { return ReadSplitLabels(source, /*train=*/true); }));
    ASSIGN_OR_RETURN(Dataset data, LoadSplitRows(source, /*train=*/true, rows, classes));
    share = std::make_shared<const Dataset>(std::move(data));
  } else {
    // The partition needs every label but only this party's images: the worker keeps its
    // share of the training set, not the whole of it.
    ASSIGN_OR_RETURN(IdxPairPaths paths, FindFashionMnist(dir, /*train=*/true));
    ASSIGN_OR_RETURN(std::vector<int64_t> rows,
                     PartyRows(task, paths.labels, [&] { return ReadIdxLabels(paths.labels); }));
    ASSIGN_OR_RETURN(Dataset data, LoadIdxPairRows(paths.images, paths.labels, rows, 10, wire::FashionNormalisation(spec)));
    share = std::make_shared<const Dataset>(std::move(data));
  }
  std::lock_guard<std::mutex> lock(mu_);
  share_ = share;  // the previous share (another job or party) is released
  share_key_ = key;
  share_job_ = task.job_id();
  return share;
}

Result<std::shared_ptr<const Dataset>> WorkerAgent::LocalTestShare(const v1::TrainTask& task) {
  const v1::JobSpec& spec = task.spec();
  const bool local = spec.data().partition().kind() == v1::PARTITION_LOCAL_FILES;
  const std::string dir = local ? options_.data_dir : wire::DatasetDirectory(spec);
  const std::string key = dir + "#" + task.job_id() + "#" + std::to_string(task.party_index());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (test_share_ && test_share_key_ == key) return test_share_;
  }
  const bool fashion = wire::IsFashionMnist(spec);
  const int classes = wire::DatasetClasses(spec);
  DataSource source;
  if (!fashion) {
    ASSIGN_OR_RETURN(source, wire::ToDataSource(spec, dir));
  }
  std::vector<int64_t> rows;
  std::vector<uint8_t> labels;
  IdxPairPaths paths;
  if (fashion) {
    ASSIGN_OR_RETURN(paths, FindFashionMnist(dir, /*train=*/false));
    ASSIGN_OR_RETURN(labels, ReadIdxLabels(paths.labels));
  } else {
    ASSIGN_OR_RETURN(labels, ReadSplitLabels(source, /*train=*/false));
  }
  const uint32_t max = spec.data().max_test_samples();
  if (max > 0 && max < labels.size()) labels.resize(max);
  if (local) {
    rows.resize(labels.size());
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
  } else {
    // The party's share of the test split, cut by the job's partition as the training split is.
    ASSIGN_OR_RETURN(PartitionConfig config, wire::ToPartitionConfig(spec));
    auto partitioned = PartitionIndices(labels, classes, config);
    if (!partitioned.ok()) return partitioned.status().WithContext(fashion ? paths.labels : LabelFiles(source, false));
    auto parts = std::move(partitioned).value();
    if (task.party_index() >= parts.size()) {
      return InvalidArgumentError("the test split's partition has no party " + std::to_string(task.party_index()));
    }
    rows = std::move(parts[task.party_index()]);
  }
  Dataset data;
  if (fashion) {
    ASSIGN_OR_RETURN(data, LoadIdxPairRows(paths.images, paths.labels, rows, 10, wire::FashionNormalisation(spec)));
  } else {
    ASSIGN_OR_RETURN(data, LoadSplitRows(source, /*train=*/false, rows, classes));
  }
  auto share = std::make_shared<const Dataset>(std::move(data));
  std::lock_guard<std::mutex> lock(mu_);
  test_share_ = share;
  test_share_key_ = key;
  test_share_job_ = task.job_id();
  return share;
}

// A job that ended gives back what the worker held for it: its share (unless another job
// loaded the same files since), its test share, its partition and its seats' residuals and
// local tensors. External trainers stay: they are the worker's, not the job's.
void WorkerAgent::ReleaseEndedJobs() {
  std::set<std::string> ended;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ended.swap(ended_jobs_);
    for (const std::string& job : ended) {
      partitions_.erase(job);
      if (share_ && share_job_ == job) {
        share_.reset();
        share_key_.clear();
      }
      if (test_share_ && test_share_job_ == job) {
        test_share_.reset();
        test_share_key_.clear();
      }
    }
  }
  for (const std::string& job : ended) {
    residuals_.EraseJob(job);
    local_tensors_.EraseJob(job);
    spdlog::info("job {} ended: the data and seats' memory held for it are released", QuoteUntrusted(job));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    PublishSeatJobsLocked();
  }
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

void WorkerAgent::PublishSeatJobsLocked() {
  seat_jobs_ = residuals_.Jobs();
  seat_jobs_.merge(local_tensors_.Jobs());
}

bool WorkerAgent::HoldsJobLocked(const std::string& job) const {
  return partitions_.count(job) > 0 || (share_ && share_job_ == job) || (test_share_ && test_share_job_ == job) ||
         seat_jobs_.count(job) > 0 || (in_hand_ && in_hand_->job == job);
}

std::vector<std::string> WorkerAgent::JobsHeld() const {
  std::set<std::string> jobs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [job, parts] : partitions_) jobs.insert(job);
    if (share_) jobs.insert(share_job_);
    if (test_share_) jobs.insert(test_share_job_);
    jobs.insert(seat_jobs_.begin(), seat_jobs_.end());
  }
  return {jobs.begin(), jobs.end()};
}

}  // namespace tessera::worker
