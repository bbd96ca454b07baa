// The round's checks of the updates it takes: shapes, non-finite values, strangers, repeats
// and late updates, the header's fields, the envelope's sets and encodings, trained models
// made deltas, the norm bound, and the aggregation of a closed round outside its lock.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "proto/tensor_transfer.h"
#include "proto/update_assembler.h"
#include "proto/update_envelope.h"
#include "server/jobs/round.h"
#include "server/strategy/strategy.h"
#include "small_tensors.h"

namespace tessera::server {
namespace {

using testing::Layout;

std::unique_ptr<Strategy> FedAvg(const TensorSet& layout) {
  v1::JobSpec spec;
  spec.set_strategy("fedavg");
  auto strategy = CreateStrategy(spec, layout);
  EXPECT_TRUE(strategy.ok()) << strategy.status().ToString();
  return std::move(strategy).value();
}

class RoundTest : public ::testing::Test {
 protected:
  RoundTest() {
    global_ = std::make_shared<const TensorSet>(Layout(1, 1, 1));
    fedavg_ = FedAvg(*global_);
    round_ = std::make_unique<Round>("job-1", 4, 1, 3, global_, fedavg_->BeginRound(*global_), 1);
    round_->AddParticipant(0, {{"w1", 1}});
    round_->AddParticipant(1, {{"w2", 1}});
    round_->AddParticipant(2, {{"w3", 1}});
  }
  static v1::UpdateHeader Header(const std::string& worker) { return testing::HeaderFor(worker, 10); }
  std::shared_ptr<const TensorSet> global_;
  std::unique_ptr<Strategy> fedavg_;
  std::unique_ptr<Round> round_;
};

TEST_F(RoundTest, RefusesAWrongShapeAndLeavesTheAggregateUntouched) {
  TensorSet wrong = {{"w", {3}, {1, 1, 1}}, {"b", {1}, {1}}};
  Status s = round_->Submit(Header("w1"), wrong, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("w1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("round 4"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("expected shape [2], got [3]"), std::string::npos) << s.message();
  ASSERT_TRUE(round_->Submit(Header("w2"), Layout(2, 2, 2), 1).ok());
  round_->Close("test");
  auto next = round_->Finish(*fedavg_);
  ASSERT_TRUE(next.ok());
  EXPECT_FLOAT_EQ(next->model[0].values[0], 3.0f);  // only w2's delta
  EXPECT_EQ(round_->accepted(), 1u);
}

TEST_F(RoundTest, RefusesNaNAndInfinity) {
  TensorSet nan = Layout(0, std::numeric_limits<float>::quiet_NaN(), 0);
  Status s = round_->Submit(Header("w1"), nan, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("NaN"), std::string::npos) << s.message();
  TensorSet inf = Layout(0, 0, std::numeric_limits<float>::infinity());
  s = round_->Submit(Header("w2"), inf, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("infinite"), std::string::npos) << s.message();
  EXPECT_EQ(round_->accepted(), 0u);
  round_->Close("test");
  EXPECT_EQ(round_->Finish(*fedavg_).status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(RoundTest, RefusesPastRoundsStaleModelsStrangersAndRepeats) {
  auto past = Header("w1");
  past.set_round(3);
  Status s = round_->Admit(past);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("past round"), std::string::npos) << s.message();

  auto stale = Header("w1");
  stale.set_base_model_version(2);
  EXPECT_NE(round_->Admit(stale).message().find("expected version 3"), std::string::npos);

  EXPECT_NE(round_->Admit(Header("w9")).message().find("not selected"), std::string::npos);

  auto empty = Header("w1");
  empty.set_samples(0);
  EXPECT_EQ(round_->Admit(empty).code(), StatusCode::kInvalidArgument);

  ASSERT_TRUE(round_->Submit(Header("w1"), Layout(0, 0, 0), 1).ok());
  EXPECT_NE(round_->Admit(Header("w1")).message().find("already reported"), std::string::npos);
}

// A malformed field is the fault of a pending participant only: the runner logs, notes and
// counts an InvalidArgument against its worker, so a stranger, a worker that already
// reported and a late one are refused for what they are (FailedPrecondition, rate-limited)
// however malformed their header, and cannot flood the job's log and events.
TEST_F(RoundTest, OnlyAPendingParticipantsFieldsAreJudged) {
  auto empty = [](const std::string& worker) {
    auto h = Header(worker);
    h.set_samples(0);
    return h;
  };
  Status stranger = round_->Admit(empty("w9"));
  EXPECT_EQ(stranger.code(), StatusCode::kFailedPrecondition) << stranger.ToString();
  EXPECT_NE(stranger.message().find("not selected"), std::string::npos) << stranger.message();

  Status pending = round_->Admit(empty("w2"));
  EXPECT_EQ(pending.code(), StatusCode::kInvalidArgument) << pending.ToString();
  EXPECT_NE(pending.message().find("field 'samples': expected a positive sample count, got 0"), std::string::npos)
      << pending.message();

  ASSERT_TRUE(round_->Submit(Header("w1"), Layout(0, 0, 0), 1).ok());
  Status again = round_->Admit(empty("w1"));
  EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition) << again.ToString();
  EXPECT_NE(again.message().find("already reported"), std::string::npos) << again.message();

  round_->Close("test");
  Status late = round_->Admit(empty("w3"));
  EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition) << late.ToString();
  EXPECT_NE(late.message().find("the round has closed"), std::string::npos) << late.message();
}

// FedAvg's step, calling `during` first: what a gRPC thread does while the job's thread
// aggregates a closed round.
class FinishWatchingStrategy final : public Strategy {
 public:
  FinishWatchingStrategy(std::unique_ptr<Strategy> inner, std::function<void()> during)
      : inner_(std::move(inner)), during_(std::move(during)) {}
  std::string_view name() const override { return "finish-watching"; }
  Status Restore(TensorSet state) override { return inner_->Restore(std::move(state)); }
  const TensorSet& state() const override { return inner_->state(); }
  std::unique_ptr<RoundAggregate> BeginRound(const TensorSet& global) const override {
    return inner_->BeginRound(global);
  }
  Result<StrategyStep> Finish(const TensorSet& global, const RoundAggregate& aggregate) const override {
    during_();
    return inner_->Finish(global, aggregate);
  }
  void Adopt(TensorSet state) override { inner_->Adopt(std::move(state)); }

 private:
  std::unique_ptr<Strategy> inner_;
  std::function<void()> during_;
};

// The aggregation runs outside the round's lock: a late upload, a download's record and a
// liveness check are answered while it runs (here from inside it; with the lock held they
// would wait for it, and here never return).
TEST_F(RoundTest, ALateUploadIsAnsweredWhileTheClosedRoundAggregates) {
  ASSERT_TRUE(round_->Submit(Header("w1"), Layout(2, 2, 2), 1).ok());
  round_->Close("quorum");
  bool asked = false;
  FinishWatchingStrategy watching(FedAvg(*global_), [&] {
    asked = true;
    Status late = round_->Admit(Header("w2"));
    EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition) << late.ToString();
    EXPECT_NE(late.message().find("the round has closed (quorum)"), std::string::npos) << late.message();
    EXPECT_FALSE(round_->IsPending("w2"));
    round_->RecordDownload("w2", 100);
  });
  auto step = round_->Finish(watching);
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_TRUE(asked);
  EXPECT_FLOAT_EQ(step->model[0].values[0], 3.0f);
  v1::RoundRecord record;
  round_->FillRecord(&record);
  EXPECT_EQ(record.download_bytes(), 100u);
}

TEST_F(RoundTest, ClosingDropsThePendingAndRefusesLateUpdates) {
  ASSERT_TRUE(round_->Submit(Header("w1"), Layout(0, 0, 0), 1).ok());
  auto dropped = round_->Close("deadline passed");
  EXPECT_EQ(dropped, (std::vector<std::string>{"w2", "w3"}));
  EXPECT_NE(round_->Admit(Header("w2")).message().find("closed"), std::string::npos);
  v1::RoundRecord record;
  round_->FillRecord(&record);
  EXPECT_EQ(record.clients_selected(), 3u);
  EXPECT_EQ(record.clients_reported(), 1u);
}

// The train loss a worker reports is averaged into the round's record by samples: a NaN, an
// infinity or a finite value too large to sum is refused at the header, and the record's
// figure is the accepted updates' mean.
TEST_F(RoundTest, AReportedTrainLossThatIsNotFiniteOrTooLargeIsRefused) {
  auto nan = Header("w1");
  nan.set_train_loss(std::numeric_limits<double>::quiet_NaN());
  Status s = round_->Submit(nan, Layout(1, 1, 1), 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("field 'train_loss'"), std::string::npos) << s.message();
  auto huge = Header("w2");
  huge.set_train_loss(1e308);
  s = round_->Admit(huge);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("field 'train_loss'"), std::string::npos) << s.message();
  huge.set_train_loss(-std::numeric_limits<double>::infinity());
  EXPECT_EQ(round_->Admit(huge).code(), StatusCode::kInvalidArgument);
  auto fine = Header("w3");
  fine.set_train_loss(0.5);
  ASSERT_TRUE(round_->Submit(fine, Layout(1, 1, 1), 1).ok());
  round_->Close("test");
  v1::RoundRecord record;
  round_->FillRecord(&record);
  EXPECT_EQ(record.clients_reported(), 1u);
  EXPECT_DOUBLE_EQ(record.train_loss(), 0.5);
}

// The backend a cohort reports is kept in the round's record, which operators read: a name
// with control characters, or megabytes of one, is refused at the header and never recorded.
TEST_F(RoundTest, AReportedCollectiveBackendMustBeABackendsName) {
  auto escape = Header("w1");
  escape.set_collective_backend("gloo\x1b[2J\n");
  Status s = round_->Submit(escape, Layout(1, 1, 1), 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("field 'collective_backend'"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find('\x1b'), std::string::npos) << "the refusal quotes it escaped";
  auto long_name = Header("w2");
  long_name.set_collective_backend(std::string(1 << 20, 'a'));
  s = round_->Submit(long_name, Layout(1, 1, 1), 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_LT(s.message().size(), 1000u);
  auto gloo = Header("w3");
  gloo.set_collective_backend("gloo");
  ASSERT_TRUE(round_->Submit(gloo, Layout(1, 1, 1), 1).ok());
  round_->Close("test");
  v1::RoundRecord record;
  round_->FillRecord(&record);
  EXPECT_EQ(record.clients_reported(), 1u);
  for (const auto& report : record.workers()) {
    EXPECT_EQ(report.collective_backend(), report.worker_id() == "w3" ? "gloo" : "") << report.worker_id();
  }
}

TEST_F(RoundTest, TheEnvelopeNamesItsSetsAndTheirEncodings) {
  const v1::TensorManifest manifest = wire::BuildManifest(*global_);
  auto with_sets = [&](std::vector<std::pair<std::string, v1::Encoding>> sets) {
    v1::UpdateHeader h = Header("w1");
    for (const auto& [name, encoding] : sets) {
      auto* set = h.add_sets();
      set->set_name(name);
      set->set_encoding(encoding);
      *set->mutable_manifest() = manifest;
    }
    return h;
  };
  // An older worker: the manifest alone is the float32 delta.
  v1::UpdateHeader legacy = Header("w1");
  *legacy.mutable_manifest() = manifest;
  EXPECT_TRUE(round_->CheckManifest(legacy).ok());
  EXPECT_TRUE(round_->CheckManifest(with_sets({{"delta", v1::ENCODING_FLOAT32}})).ok());
  EXPECT_TRUE(round_->CheckManifest(with_sets({{"delta", v1::ENCODING_UNSPECIFIED}})).ok());

  Status s = round_->CheckManifest(with_sets({{"delta", v1::ENCODING_FLOAT32}, {"control", v1::ENCODING_FLOAT32}}));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("set 'control' is not one this job's strategy reads; expected 'delta'"), std::string::npos)
      << s.message();
  s = round_->CheckManifest(with_sets({{"delta", v1::ENCODING_INT8}}));
  EXPECT_NE(s.message().find("set 'delta' is encoded int8; this job expects float32"), std::string::npos)
      << s.message();
  s = round_->CheckManifest(with_sets({{"delta", static_cast<v1::Encoding>(9)}}));
  EXPECT_NE(s.message().find("set 'delta': encoding 9 is not one this build reads"), std::string::npos)
      << s.message();
  s = round_->CheckManifest(with_sets({{"control", v1::ENCODING_FLOAT32}}));
  EXPECT_NE(s.message().find("no 'delta' set"), std::string::npos) << s.message();
  s = round_->CheckManifest(with_sets({{"delta", v1::ENCODING_FLOAT32}, {"delta", v1::ENCODING_FLOAT32}}));
  EXPECT_NE(s.message().find("appears twice"), std::string::npos) << s.message();
  // A worker's set name reaches the refusal (and the log and the round's record) escaped.
  const std::string forged = "x\n[error] round 4 aborted\x1b[2J";
  for (const auto& sets : std::vector<std::vector<std::pair<std::string, v1::Encoding>>>{
           {{"delta", v1::ENCODING_FLOAT32}, {forged, v1::ENCODING_FLOAT32}},
           {{"delta", v1::ENCODING_FLOAT32}, {forged, v1::ENCODING_FLOAT32}, {forged, v1::ENCODING_FLOAT32}},
           {{"delta", v1::ENCODING_FLOAT32}, {forged, static_cast<v1::Encoding>(9)}}}) {
    s = round_->CheckManifest(with_sets(sets));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("set 'x\\n[error] round 4 aborted\\x1b[2J'"), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find('\x1b'), std::string::npos) << s.message();
  }
  v1::UpdateHeader both = with_sets({{"delta", v1::ENCODING_FLOAT32}});
  *both.mutable_manifest() = manifest;
  s = round_->CheckManifest(both);
  EXPECT_NE(s.message().find("both 'manifest' and 'sets'"), std::string::npos) << s.message();
}

// A job with [compression]: its delta must come in the job's encoding, and the record counts
// the bytes of the accepted updates as they came and of every model download.
TEST_F(RoundTest, TheDeltaMustComeInTheJobsEncodingAndItsBytesAreRecorded) {
  round_->SetDeltaEncoding(UpdateEncoding::kInt8, 0);
  auto encoded = [&](UpdateEncoding encoding) {
    v1::UpdateHeader h = Header("w1");
    wire::UpdateBytes bytes;
    wire::AppendUpdateSet(wire::kDeltaSet, *global_, encoding, 0.5, 1 << 20, &h, &bytes);
    return h;
  };
  EXPECT_TRUE(round_->CheckManifest(encoded(UpdateEncoding::kInt8)).ok());
  for (UpdateEncoding other : {UpdateEncoding::kFloat32, UpdateEncoding::kFloat16, UpdateEncoding::kTopK}) {
    Status s = round_->CheckManifest(encoded(other));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(std::string("set 'delta' is encoded ") + UpdateEncodingName(other) +
                               "; this job expects int8 (its [compression] encoding)"),
              std::string::npos)
        << s.message();
  }
  // An older worker's manifest alone is a float32 delta: refused too.
  v1::UpdateHeader legacy = Header("w1");
  *legacy.mutable_manifest() = wire::BuildManifest(*global_);
  EXPECT_NE(round_->CheckManifest(legacy).message().find("is encoded float32; this job expects int8"), std::string::npos);
  // A header whose dtype is not its encoding's.
  v1::UpdateHeader dtype = encoded(UpdateEncoding::kInt8);
  dtype.mutable_sets(0)->mutable_manifest()->mutable_tensors(0)->set_dtype(v1::DTYPE_FLOAT32);
  EXPECT_NE(round_->CheckManifest(dtype).message().find("tensor 'w': expected dtype DTYPE_INT8 for int8, got DTYPE_FLOAT32"),
            std::string::npos)
      << round_->CheckManifest(dtype).message();

  round_->RecordDownload("w1", 100);
  round_->RecordDownload("w2", 100);
  round_->RecordDownload("member-of-a-cohort", 100);  // not a participant's leader: counted in the round's total
  ASSERT_TRUE(round_->Submit(Header("w1"), Layout(0, 0, 0), 1, nullptr, 19).ok());
  ASSERT_TRUE(round_->Submit(Header("w2"), Layout(0, 0, 0), 1, nullptr, 23).ok());
  ASSERT_FALSE(round_->Submit(Header("w3"), Layout(0, std::numeric_limits<float>::quiet_NaN(), 0), 1, nullptr, 29).ok());
  round_->Close("done");
  v1::RoundRecord record;
  round_->FillRecord(&record);
  EXPECT_EQ(record.upload_bytes(), 19u + 23u);  // the refused update's bytes are not counted
  EXPECT_EQ(record.download_bytes(), 300u);
  for (const auto& w : record.workers()) {
    if (w.worker_id() == "w1") {
      EXPECT_EQ(w.upload_bytes(), 19u);
      EXPECT_EQ(w.download_bytes(), 100u);
    }
    if (w.worker_id() == "w3") {
      EXPECT_EQ(w.upload_bytes(), 29u);  // received in full, then refused
      EXPECT_EQ(w.download_bytes(), 0u);
    }
  }
}

// An update sent as the trained model (UpdateHeader.trained_weights) becomes the delta from
// the round's model by the float subtraction the worker would do, in the pass that checks it;
// a compressed job's updates are deltas only.
TEST_F(RoundTest, ATrainedModelBecomesItsDeltaFromTheRoundsVersion) {
  const TensorSet global = Layout(0.1f, -2.5f, 3.0f);
  TensorSet trained = Layout(0.35f, -2.0f, 1e-8f);
  const TensorSet sent = trained;
  CheckedDelta checked = CheckTrainedDelta(global, trained, nullptr, {}, 1000, false, "w1");
  ASSERT_TRUE(checked.verdict.ok()) << checked.verdict.ToString();
  double squares = 0;
  for (size_t i = 0; i < trained.size(); ++i) {
    for (size_t j = 0; j < trained[i].values.size(); ++j) {
      EXPECT_EQ(trained[i].values[j], sent[i].values[j] - global[i].values[j]) << trained[i].name;
      squares += double(trained[i].values[j]) * trained[i].values[j];
    }
  }
  EXPECT_EQ(trained[1].values[0], 1e-8f - 3.0f);
  EXPECT_DOUBLE_EQ(checked.norm, std::sqrt(squares));  // the norm is the delta's, not the model's
  // The same through the round: folded as the delta (FedAvg of one update: the model moves by it).
  auto shared = std::make_shared<const TensorSet>(global);
  Round round("job-1", 4, 1, 3, shared, fedavg_->BeginRound(global), 1);
  round.AddParticipant(0, {{"w1", 1}});
  v1::UpdateHeader h = Header("w1");
  h.set_trained_weights(true);
  TensorSet upload = sent;
  ASSERT_TRUE(round.SubmitTrained(h, upload, 1).ok());
  EXPECT_EQ(upload[0].values[0], 0.35f - 0.1f);
  // Another layout is refused and left as it came.
  TensorSet wrong = {{"w", {3}, {1, 1, 1}}, {"b", {1}, {1}}};
  EXPECT_EQ(CheckTrainedDelta(global, wrong, nullptr, {}, 1000, false, "w1").verdict.code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(wrong[0].values[0], 1.0f);

  // A compressed job's updates are deltas: a trained model in int8 is refused at its envelope.
  round_->SetDeltaEncoding(UpdateEncoding::kInt8, 0);
  v1::UpdateHeader int8 = Header("w1");
  int8.set_trained_weights(true);
  wire::UpdateBytes bytes;
  wire::AppendUpdateSet(wire::kDeltaSet, *global_, UpdateEncoding::kInt8, 0, 1 << 20, &int8, &bytes);
  Status s = round_->CheckManifest(int8);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("field 'trained_weights': a trained model travels in float32 only"), std::string::npos)
      << s.message();
}

// The check's scan over every length (its vector body takes sixteen values at a time, the
// rest one by one): the norm is the delta's to double precision, and a non-finite value, or a
// sum with the model that overflows, is found wherever it sits; the trained-model variant
// leaves the same delta behind. Each check runs three ways: alone; with the global model's
// magnitudes (the scan that skips reading the model where they bound the sum); and with those
// and the delta scanned beforehand, fed in uneven pieces that split values, as the assembler
// feeds it chunks. All three give the same verdict, the same norm to the bit and the same
// overflow flag.
TEST(CheckDeltaTest, TheScanFindsTheNormAndEveryNonFiniteValueAtAnyLength) {
  const auto check = [](const TensorSet& global, const TensorSet& delta, double bound) {
    CheckedDelta full = CheckDelta(global, delta, nullptr, {}, bound, false, "w1");
    const std::vector<float> magnitudes = GlobalMagnitudes(global);
    CheckedDelta bounded = CheckDelta(global, delta, nullptr, {}, bound, false, "w1", ScanHints{&magnitudes, nullptr});
    TensorScans scans;
    for (const NamedTensor& t : delta) {
      ValueScan scan;
      const auto* bytes = reinterpret_cast<const uint8_t*>(t.values.data());
      const size_t size = t.values.size() * sizeof(float);
      for (size_t at = 0, step = 1; at < size; at += step, step = step * 3 + 2) scan.Feed(bytes + at, std::min(step, size - at));
      scans.push_back(scan.Finish());
    }
    CheckedDelta prescanned =
        CheckDelta(global, delta, nullptr, {}, bound, false, "w1", ScanHints{&magnitudes, &scans});
    for (const CheckedDelta* other : {&bounded, &prescanned}) {
      EXPECT_EQ(full.verdict.code(), other->verdict.code());
      EXPECT_EQ(full.verdict.message(), other->verdict.message());
      if (full.verdict.ok()) {
        EXPECT_EQ(full.norm, other->norm);
        EXPECT_EQ(full.non_finite_alone, other->non_finite_alone);
      }
    }
    return prescanned;
  };
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{15}, size_t{16}, size_t{17}, size_t{33}, size_t{1003}}) {
    SCOPED_TRACE(n);
    TensorSet global = {{"a", {static_cast<int64_t>(n)}, std::vector<float>(n)}, {"b", {3}, {1, 2, 3}}};
    TensorSet delta = {{"a", {static_cast<int64_t>(n)}, std::vector<float>(n)}, {"b", {3}, {0.5f, -0.25f, 4}}};
    double squares = 0.25 + 0.0625 + 16;
    for (size_t j = 0; j < n; ++j) {
      global[0].values[j] = static_cast<float>(j % 11) - 5.0f;
      delta[0].values[j] = static_cast<float>((j * 7919) % 101) * 0.013f - 0.6f;
      squares += static_cast<double>(delta[0].values[j]) * delta[0].values[j];
    }
    CheckedDelta checked = check(global, delta, 1e9);
    ASSERT_TRUE(checked.verdict.ok()) << checked.verdict.ToString();
    EXPECT_NEAR(checked.norm, std::sqrt(squares), 1e-12 * std::sqrt(squares));
    EXPECT_FALSE(checked.non_finite_alone);
    TensorSet trained = delta;
    for (size_t j = 0; j < n; ++j) trained[0].values[j] = global[0].values[j] + delta[0].values[j];
    for (size_t j = 0; j < 3; ++j) trained[1].values[j] = global[1].values[j] + delta[1].values[j];
    TensorSet expected = trained;
    for (size_t i = 0; i < 2; ++i) {
      for (size_t j = 0; j < expected[i].values.size(); ++j) expected[i].values[j] -= global[i].values[j];
    }
    CheckedDelta from_trained = CheckTrainedDelta(global, trained, nullptr, {}, 1e9, false, "w1");
    ASSERT_TRUE(from_trained.verdict.ok());
    for (size_t i = 0; i < 2; ++i) EXPECT_EQ(trained[i].values, expected[i].values);
    for (size_t at : {size_t{0}, n / 2, n == 0 ? size_t{0} : n - 1}) {
      if (n == 0) break;
      for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::quiet_NaN()}) {
        TensorSet broken = delta;
        broken[0].values[at] = bad;
        EXPECT_EQ(check(global, broken, 1e9).verdict.code(), StatusCode::kInvalidArgument) << "at " << at;
      }
      TensorSet overflowing = delta;  // finite, but the model plus it is not
      TensorSet big = global;
      big[0].values[at] = std::numeric_limits<float>::max();
      overflowing[0].values[at] = std::numeric_limits<float>::max();
      CheckedDelta over = check(big, overflowing, 1e300);
      ASSERT_TRUE(over.verdict.ok()) << "at " << at;
      EXPECT_TRUE(over.non_finite_alone) << "at " << at;
      // Magnitudes that could overflow together but sit at different places: no overflow,
      // found by the full scan the bound sends it to.
      TensorSet apart = delta;
      apart[1].values[0] = std::numeric_limits<float>::max();
      CheckedDelta fine = check(big, apart, 1e300);
      ASSERT_TRUE(fine.verdict.ok()) << "at " << at;
      EXPECT_FALSE(fine.non_finite_alone) << "at " << at;
      // A model that is not finite itself has no bound: every delta is scanned with it.
      TensorSet broken_model = global;
      broken_model[0].values[at] = std::numeric_limits<float>::infinity();
      EXPECT_TRUE(check(broken_model, delta, 1e9).non_finite_alone) << "at " << at;
    }
  }
}

TEST(UpdateEnvelopeTest, SetsTravelAsOneChunkStreamAndComeApartByName) {
  const TensorSet delta = Layout(1, 2, 3);
  const TensorSet control = {{"c", {3}, {7, 8, 9}}};
  v1::UpdateHeader header;
  wire::UpdateBytes stream;
  wire::AppendUpdateSet("delta", delta, UpdateEncoding::kFloat32, 0, 8, &header, &stream);
  wire::AppendUpdateSet("control", control, UpdateEncoding::kFloat32, 0, 8, &header, &stream);
  ASSERT_EQ(header.sets_size(), 2);
  ASSERT_EQ(stream.size(), 3u);
  EXPECT_EQ(header.sets(0).manifest().total_bytes(), 3u * sizeof(float));
  auto sets = wire::UpdateSets(header, "update");
  ASSERT_TRUE(sets.ok()) << sets.status().ToString();
  wire::UpdateAssembler assembler("update", 1 << 20, 0);
  ASSERT_TRUE(assembler.Start(*sets).ok());
  ASSERT_TRUE(wire::ForEachChunk(stream, 8, [&](const v1::TensorChunk& chunk) { return assembler.Add(chunk); }).ok());
  auto split = assembler.Finish();
  ASSERT_TRUE(split.ok()) << split.status().ToString();
  ASSERT_EQ(split->size(), 2u);
  EXPECT_EQ(TensorSetSha256((*split)["delta"]), TensorSetSha256(delta));
  EXPECT_EQ(TensorSetSha256((*split)["control"]), TensorSetSha256(control));
}

TEST_F(RoundTest, LostWorkersAreDroppedAtOnce) {
  const size_t pending = round_->DropLost([](const std::string& id, uint64_t) { return id != "w2"; });
  EXPECT_EQ(pending, 2u);
  EXPECT_NE(round_->Admit(Header("w2")).message().find("already reported"), std::string::npos);
}

}  // namespace
}  // namespace tessera::server

namespace tessera::server {
namespace {

using testing::HeaderFor;

TEST(RoundBoundsTest, ASampleCountLargerThanItsPartyIsRefusedNamingTheParty) {
  auto global = std::make_shared<const TensorSet>(Layout(1, 1, 1));
  auto fedavg = FedAvg(*global);
  Round round("job-1", 4, 1, 3, global, fedavg->BeginRound(*global), 1);
  round.AddParticipant(0, {{"w1", 1}}, "", 6000);
  round.AddParticipant(1, {{"w2", 1}}, "", 6000);
  Status s = round.Admit(HeaderFor("w1", std::numeric_limits<uint64_t>::max()));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("worker 'w1'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("round 4"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("field 'samples': expected at most 6000 (the size of party 0), got 18446744073709551615"),
            std::string::npos)
      << s.message();
  EXPECT_FALSE(round.Submit(HeaderFor("w1", 6001), Layout(1, 1, 1), 1).ok());
  EXPECT_TRUE(round.Submit(HeaderFor("w2", 6000), Layout(1, 1, 1), 1).ok());
}

TEST(RoundBoundsTest, AnUpdateWhoseNormExceedsTheBoundIsRefusedWithBothFigures) {
  auto global = std::make_shared<const TensorSet>(Layout(1, 1, 1));
  auto fedavg = FedAvg(*global);
  Round round("job-1", 4, 1, 3, global, fedavg->BeginRound(*global), 1, {}, /*max_update_norm=*/10);
  round.AddParticipant(0, {{"w1", 1}});
  round.AddParticipant(1, {{"w2", 1}});
  // Finite, and large enough to overflow a sum of a few of them in float.
  Status s = round.Submit(HeaderFor("w1", 10), Layout(1e38f, 1e38f, 0), 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("worker 'w1'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("L2 norm 1.41421e+38 exceeds the job's max_update_norm 10"), std::string::npos)
      << s.message();
  ASSERT_TRUE(round.Submit(HeaderFor("w2", 10), Layout(3, 4, 0), 1).ok());  // norm 5
  round.Close("test");
  v1::RoundRecord record;
  round.FillRecord(&record);
  for (const auto& w : record.workers()) {
    if (w.worker_id() == "w2") {
      EXPECT_DOUBLE_EQ(w.update_norm(), 5);
    }
    if (w.worker_id() == "w1") {
      EXPECT_NE(w.outcome().find("max_update_norm"), std::string::npos) << w.outcome();
    }
  }
  auto next = round.Finish(*fedavg);
  ASSERT_TRUE(next.ok());
  EXPECT_FLOAT_EQ(next->model[0].values[0], 4.0f);  // w2's alone
}

TEST(RoundBoundsTest, TheUpdatesBehindAModelThatIsNotFiniteAreNamed) {
  // A global model near float's limit: w1's update overflows it on its own.
  auto global = std::make_shared<const TensorSet>(Layout(3e38f, 1, 1));
  auto fedavg = FedAvg(*global);
  Round round("job-1", 4, 1, 3, global, fedavg->BeginRound(*global), 1);
  round.AddParticipant(0, {{"w1", 1}});
  round.AddParticipant(1, {{"w2", 1}});
  ASSERT_TRUE(round.Submit(HeaderFor("w1", 10), Layout(3e38f, 0, 0), 1).ok());
  ASSERT_TRUE(round.Submit(HeaderFor("w2", 10), Layout(1, 1, 1), 1).ok());
  round.Close("test");
  auto next = round.Finish(*fedavg);
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(CheckFinite(next->model, "model").ok());
  auto suspects = round.NonFiniteSuspects();
  ASSERT_EQ(suspects.size(), 1u);
  EXPECT_EQ(suspects[0].workers, std::vector<std::string>{"w1"});
  EXPECT_NE(suspects[0].description.find("alone overflows"), std::string::npos) << suspects[0].description;
}

// Every suspect is left out, but a message names the first eight and counts the rest: a round
// may have thousands, and the message may become the job's error.
TEST(RoundBoundsTest, AMessageNamesEightSuspectsAndCountsTheRest) {
  auto global = std::make_shared<const TensorSet>(Layout(3e38f, 1, 1));
  auto fedavg = FedAvg(*global);
  Round round("job-1", 4, 1, 3, global, fedavg->BeginRound(*global), 1);
  for (uint32_t i = 0; i < 11; ++i) round.AddParticipant(i, {{"w" + std::to_string(i), 1}});
  for (uint32_t i = 0; i < 11; ++i) {
    ASSERT_TRUE(round.Submit(HeaderFor("w" + std::to_string(i), 10), Layout(3e38f, 0, 0), 1).ok());
  }
  round.Close("test");
  const auto suspects = round.NonFiniteSuspects();
  ASSERT_EQ(suspects.size(), 11u);
  const std::string described = Round::DescribeSuspects(suspects);
  size_t named = 0;
  for (size_t at = described.find("worker '"); at != std::string::npos; at = described.find("worker '", at + 1)) ++named;
  EXPECT_EQ(named, 8u) << described;
  EXPECT_NE(described.find(" and 3 more"), std::string::npos) << described;
  EXPECT_EQ(Round::DescribeSuspects({}), "nobody");
}

}  // namespace
}  // namespace tessera::server
