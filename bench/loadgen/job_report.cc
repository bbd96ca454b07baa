#include "bench/loadgen/job_report.h"

#include <algorithm>
#include <cstdio>

#include "core/model/model.h"
#include "device/registry.h"
#include "proto/job_mapping.h"

namespace tessera::loadgen {
namespace {

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace

v1::JobSpec MakeJobSpec(const JobSettings& s) {
  v1::JobSpec spec;
  spec.set_name(s.name);
  spec.mutable_model()->set_name(s.model);
  for (uint32_t width : s.hidden) spec.mutable_model()->add_hidden(width);
  spec.set_strategy("fedavg");
  spec.set_rounds(s.rounds);
  spec.set_clients_per_round(s.clients);
  spec.set_min_clients(s.clients);
  spec.set_round_deadline_ms(s.round_deadline_ms);
  spec.set_local_epochs(s.local_epochs);
  spec.set_batch_size(s.batch_size);
  spec.set_seed(s.seed);
  spec.set_max_round_attempts(1);
  spec.set_device("cpu");
  auto* optimizer = spec.mutable_optimizer();
  optimizer->set_name("sgd");
  optimizer->set_learning_rate(0.01);
  optimizer->set_momentum(0.9);
  auto* data = spec.mutable_data();
  data->set_dataset("fashion-mnist");
  data->set_max_train_samples(s.max_train_samples > 0 ? s.max_train_samples : s.clients);
  data->set_max_test_samples(s.max_test_samples);
  auto* partition = data->mutable_partition();
  partition->set_kind(s.partition == "local-files" ? v1::PARTITION_LOCAL_FILES : v1::PARTITION_IID);
  partition->set_parties(s.clients);
  partition->set_seed(s.seed);
  if (s.download != v1::ENCODING_UNSPECIFIED && s.download != v1::ENCODING_FLOAT32) {
    spec.mutable_compression()->set_download(s.download);
  }
  return spec;
}

Result<int64_t> ModelParameters(const v1::JobSpec& spec) {
  ASSIGN_OR_RETURN(auto device, CreateDevice("cpu"));
  ASSIGN_OR_RETURN(auto model, CreateModel(wire::ToModelConfig(spec), device.get()));
  return model->NumParameters();
}

JobSummary SummarizeJob(const v1::GetJobResponse& job, uint32_t warmup, uint32_t expected_clients) {
  JobSummary summary;
  summary.rounds_committed = job.rounds_size();
  std::vector<double> total, interval, selection, distribution, compute, upload, straggler, aggregation, evaluation,
      commit;
  std::string problem;
  int64_t previous_commit = 0;
  for (const auto& r : job.rounds()) {
    if (problem.empty()) {
      if (r.attempt() != 1) {
        problem = "round " + std::to_string(r.round()) + " needed attempt " + std::to_string(r.attempt());
      } else if (r.clients_selected() != expected_clients || r.clients_reported() != expected_clients) {
        problem = "round " + std::to_string(r.round()) + ": " + std::to_string(r.clients_reported()) + " of " +
                  std::to_string(r.clients_selected()) + " selected clients accepted, expected " +
                  std::to_string(expected_clients) + " of " + std::to_string(expected_clients);
      }
    }
    const bool measured = job.rounds_size() <= static_cast<int>(warmup) || r.round() > warmup;
    if (measured) {
      const auto& l = r.latency();
      total.push_back(l.total_ms());
      selection.push_back(l.selection_ms());
      distribution.push_back(l.distribution_ms());
      compute.push_back(l.compute_ms_median());
      upload.push_back(l.upload_ms());
      straggler.push_back(l.straggler_wait_ms());
      aggregation.push_back(l.aggregation_ms());
      evaluation.push_back(l.evaluation_ms());
      commit.push_back(l.commit_ms());
      if (previous_commit > 0) interval.push_back(static_cast<double>(r.committed_unix_ms() - previous_commit));
      ++summary.rounds_measured;
    }
    previous_commit = r.committed_unix_ms();
  }
  RoundMedians& m = summary.medians;
  m.total = Median(total);
  m.interval = Median(interval);
  m.selection = Median(selection);
  m.distribution = Median(distribution);
  m.compute = Median(compute);
  m.upload = Median(upload);
  m.straggler = Median(straggler);
  m.aggregation = Median(aggregation);
  m.evaluation = Median(evaluation);
  m.commit = Median(commit);
  if (problem.empty() && job.job().state() != v1::JOB_SUCCEEDED) {
    problem = "job " + job.job().id() + " is " + v1::JobState_Name(job.job().state()) +
              (job.job().error().empty() ? "" : ": " + job.job().error());
  }
  if (problem.empty() && summary.rounds_committed != job.job().spec().rounds()) {
    problem = std::to_string(summary.rounds_committed) + " of " + std::to_string(job.job().spec().rounds()) +
              " rounds committed";
  }
  summary.all_accepted = problem.empty();
  summary.problem = problem;
  return summary;
}

void PrintRounds(std::ostream& out, const v1::GetJobResponse& job) {
  char line[256];
  std::snprintf(line, sizeof(line), "%5s %3s %11s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n", "round", "att", "accepted",
                "total_ms", "select", "distrib", "compute", "upload", "straggle", "aggreg", "eval", "commit");
  out << line;
  for (const auto& r : job.rounds()) {
    const auto& l = r.latency();
    const std::string accepted = std::to_string(r.clients_reported()) + "/" + std::to_string(r.clients_selected());
    std::snprintf(line, sizeof(line), "%5u %3u %11s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f\n",
                  r.round(), r.attempt(), accepted.c_str(), l.total_ms(), l.selection_ms(), l.distribution_ms(),
                  l.compute_ms_median(), l.upload_ms(), l.straggler_wait_ms(), l.aggregation_ms(), l.evaluation_ms(),
                  l.commit_ms());
    out << line;
  }
}

}  // namespace tessera::loadgen
