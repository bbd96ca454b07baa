// An asynchronous job in a job spec: `mode` and the [async] table, their defaults and ranges,
// what cannot apply with them, in job.toml and over the wire.
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "cli/job_spec.h"
#include "proto/job_mapping.h"
#include "tests/cli/job_spec_expectations.h"

namespace tessera {
namespace {

using testing::ExpectError;
using testing::ExpectRefused;

// Ten parties, six a round; `lines` at the top level, `tables` at the end.
std::string Job(const std::string& lines, const std::string& tables = "") {
  return "name = \"t\"\nrounds = 5\nclients_per_round = 6\n" + lines +
         "[model]\nname = \"mlp\"\n[data.partition]\nparties = 10\n" + tables;
}

Result<v1::JobSpec> Parse(const std::string& text) { return ParseJobSpecString(text, "job.toml"); }

TEST(AsyncSpecTest, SyncIsTheDefaultAndHasNoAsyncOptions) {
  Result<v1::JobSpec> spec = Parse(Job(""));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_FALSE(spec->has_async());
  EXPECT_FALSE(wire::IsAsync(*spec));
  Result<v1::JobSpec> named = Parse(Job("mode = \"sync\"\n"));
  ASSERT_TRUE(named.ok()) << named.status().ToString();
  EXPECT_FALSE(named->has_async());
  ExpectError(Job("mode = \"sync\"\n", "[async]\nbuffer_size = 3\n"),
              {"job.toml:", "'async'", "applies to mode = \"async\" only; mode is \"sync\""});
}

// Over-selection is for rounds: an asynchronous job has none, and the key is refused, not
// ignored.
TEST(AsyncSpecTest, OverSelectionIsRefusedForAnAsyncJob) {
  Result<v1::JobSpec> spec = Parse(Job("mode = \"async\"\n", "[selection]\nover_selection = 0.9\n"));
  const Status s = spec.ok() ? wire::ValidateJobSpec(*spec) : spec.status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("selection.over_selection"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("asynchronous"), std::string::npos) << s.message();
  Result<v1::JobSpec> plain = Parse(Job("mode = \"async\"\n", "[selection]\npolicy = \"random\"\n"));
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_TRUE(wire::ValidateJobSpec(*plain).ok()) << wire::ValidateJobSpec(*plain).ToString();
}

TEST(AsyncSpecTest, AsyncGetsTheDefaults) {
  Result<v1::JobSpec> spec = Parse(Job("mode = \"async\"\n"));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  ASSERT_TRUE(wire::IsAsync(*spec));
  const v1::AsyncSpec& a = spec->async();
  EXPECT_EQ(a.concurrency(), 6u);   // clients_per_round
  EXPECT_EQ(a.buffer_size(), 6u);   // min(10, concurrency)
  EXPECT_EQ(a.max_staleness(), 10u);
  EXPECT_EQ(a.staleness_weighting(), "polynomial");
  EXPECT_DOUBLE_EQ(a.staleness_exponent(), 0.5);
  EXPECT_TRUE(wire::ValidateJobSpec(*spec).ok());

  Result<v1::JobSpec> wide = Parse("name = \"t\"\nrounds = 5\nmode = \"ASYNC\"\n[model]\nname = \"mlp\"\n"
                                   "[data.partition]\nparties = 40\n");
  ASSERT_TRUE(wide.ok()) << wide.status().ToString();
  EXPECT_EQ(wide->async().concurrency(), 40u);
  EXPECT_EQ(wide->async().buffer_size(), 10u);
}

TEST(AsyncSpecTest, TheOptionsAreReadAndRoundTrip) {
  Result<v1::JobSpec> spec =
      Parse(Job("mode = \"async\"\nstrategy = \"fedadam\"\n",
                "[async]\nbuffer_size = 3\nmax_staleness = 4\nstaleness_exponent = 1.5\nconcurrency = 8\n"));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->async().buffer_size(), 3u);
  EXPECT_EQ(spec->async().max_staleness(), 4u);
  EXPECT_DOUBLE_EQ(spec->async().staleness_exponent(), 1.5);
  EXPECT_EQ(spec->async().concurrency(), 8u);
  Result<v1::JobSpec> constant =
      Parse(Job("mode = \"async\"\n", "[async]\nstaleness_weighting = \"constant\"\nmax_staleness = 0\n"));
  ASSERT_TRUE(constant.ok()) << constant.status().ToString();
  EXPECT_EQ(constant->async().staleness_weighting(), "constant");
  EXPECT_DOUBLE_EQ(constant->async().staleness_exponent(), 0);
  EXPECT_EQ(constant->async().max_staleness(), 0u);
  for (const auto* parsed : {&*spec, &*constant}) {
    const std::string text = JobSpecToToml(*parsed);
    Result<v1::JobSpec> again = ParseJobSpecString(text, "shown.toml");
    ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << text;
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*parsed, *again)) << text;
  }
}

TEST(AsyncSpecTest, TyposRangesAndKeysThatCannotApplyAreRefusedWithTheirLine) {
  const std::string async = "mode = \"async\"\n";
  ExpectError(Job("mode = \"asynchronous\"\n"), {"job.toml:4:", "'mode'", "expected one of \"sync\", \"async\""});
  ExpectError(Job(async, "[async]\nbufer_size = 3\n"),
              {"job.toml:", "unknown key 'async.bufer_size'", "allowed keys in [async]: buffer_size"});
  ExpectError(Job(async, "[async]\nbuffer_size = 0\n"), {"'async.buffer_size'", "must be at least 1, got 0"});
  ExpectError(Job(async, "[async]\nbuffer_size = 10001\n"), {"'async.buffer_size'", "must be at most 10000"});
  ExpectError(Job(async, "[async]\nconcurrency = 11\n"),
              {"'async.concurrency'", "must be at most data.partition.parties (10), got 11"});
  ExpectError(Job(async, "[async]\nconcurrency = 0\n"), {"'async.concurrency'", "must be at least 1"});
  ExpectError(Job(async, "[async]\nmax_staleness = -1\n"), {"'async.max_staleness'", "must be at least 0"});
  ExpectError(Job(async, "[async]\nmax_staleness = 100001\n"), {"'async.max_staleness'", "must be at most 100000"});
  ExpectError(Job(async, "[async]\nstaleness_weighting = \"linear\"\n"),
              {"'async.staleness_weighting'", "expected one of \"polynomial\", \"constant\""});
  ExpectError(Job(async, "[async]\nstaleness_exponent = 11\n"), {"'async.staleness_exponent'", "must be in [0, 10]"});
  ExpectError(Job(async, "[async]\nstaleness_exponent = -0.5\n"), {"'async.staleness_exponent'", "must be in [0, 10]"});
  ExpectError(Job(async, "[async]\nstaleness_weighting = \"constant\"\nstaleness_exponent = 0.5\n"),
              {"'async.staleness_exponent'", "applies to staleness_weighting = \"polynomial\" only"});
  ExpectError(Job(async, "[async]\nbuffer_size = \"3\"\n"), {"'async.buffer_size'", "expected an integer, found a string"});
  ExpectError(Job(async + "min_clients = 3\n"), {"job.toml:5:", "'min_clients'", "applies to mode \"sync\" only"});
}

TEST(AsyncSpecTest, StrategiesAndRulesThatCannotApplyAreRefused) {
  ExpectError(Job("mode = \"async\"\nstrategy = \"scaffold\"\n"),
              {"job.toml:5:", "spec.strategy: expected fedavg, fedavgm, fedadam, fedyogi, fedadagrad or fedprox with an "
                              "asynchronous job"});
  ExpectError(Job("mode = \"async\"\nstrategy = \"fednova\"\n"), {"spec.strategy", "asynchronous job"});
  ExpectError(Job("mode = \"async\"\naggregation = \"median\"\n"),
              {"spec.aggregation.rule: expected \"mean\" with an asynchronous job"});
  for (const char* strategy : {"fedavg", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "fedprox"}) {
    SCOPED_TRACE(strategy);
    Result<v1::JobSpec> spec = Parse(Job(std::string("mode = \"async\"\nstrategy = \"") + strategy + "\"\n"));
    EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  }
}

TEST(AsyncSpecTest, WhatOnlySynchronousRoundsDoIsRefused) {
  ExpectError(Job("mode = \"async\"\n", "[selection]\npolicy = \"deadline\"\n"),
              {"selection.policy", "\"random\" with an asynchronous job"});
  ExpectError(Job("mode = \"async\"\n", "[compression]\nencoding = \"int8\"\n"),
              {"compression.encoding", "\"float32\" with an asynchronous job"});
  ExpectError(Job("mode = \"async\"\n", "[evaluation]\nfederated = true\n"),
              {"evaluation.federated", "false with an asynchronous job"});
  // Their defaults are fine.
  Result<v1::JobSpec> plain = Parse(Job("mode = \"async\"\n", "[selection]\npolicy = \"random\"\n[compression]\nencoding = "
                                                              "\"float32\"\n[evaluation]\nfederated = false\n"));
  EXPECT_TRUE(plain.ok()) << plain.status().ToString();
}

// examples/fmnist-fedbuff.toml says what docs/JOBS.md says of it.
TEST(AsyncSpecTest, TheFedBuffExampleIsTheDemoRunAsynchronously) {
  Result<v1::JobSpec> spec =
      ParseJobSpecFile((std::filesystem::path(TESSERA_SOURCE_DIR) / "examples" / "fmnist-fedbuff.toml").string());
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  ASSERT_TRUE(spec->has_async());
  EXPECT_EQ(spec->async().concurrency(), 10u);
  EXPECT_EQ(spec->async().buffer_size(), 5u);
  EXPECT_EQ(spec->async().max_staleness(), 4u);
  EXPECT_EQ(spec->rounds(), 24u);
  EXPECT_EQ(spec->model().name(), "simplecnn");
  EXPECT_EQ(spec->data().partition().parties(), 10u);
  EXPECT_EQ(spec->local_epochs(), 2u);
}

// What the coordinator checks of a spec however it came.
TEST(AsyncSpecTest, TheWireChecksTheOptions) {
  Result<v1::JobSpec> parsed = Parse(Job("mode = \"async\"\n"));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const v1::JobSpec good = *parsed;
  v1::JobSpec s = good;
  s.mutable_async()->set_buffer_size(0);
  ExpectRefused(s, "async.buffer_size", "an integer in [1, 10000]");
  s = good;
  s.mutable_async()->set_concurrency(0);
  ExpectRefused(s, "async.concurrency", "an integer in [1, 10000]");
  s = good;
  s.mutable_async()->set_concurrency(11);
  ExpectRefused(s, "async.concurrency", "at most data.partition.parties (10)");
  s = good;
  s.mutable_async()->set_max_staleness(4000000000u);
  ExpectRefused(s, "async.max_staleness", "an integer in [0, 100000]");
  s = good;
  s.mutable_async()->set_staleness_weighting(std::string(5000, 'x'));
  ExpectRefused(s, "async.staleness_weighting", "\"polynomial\" or \"constant\"");
  s = good;
  s.mutable_async()->set_staleness_weighting("");
  ExpectRefused(s, "async.staleness_weighting", "\"polynomial\" or \"constant\"");
  s = good;
  s.mutable_async()->set_staleness_exponent(std::nan(""));
  ExpectRefused(s, "async.staleness_exponent", "a number in [0, 10]");
  s = good;
  s.mutable_async()->set_staleness_weighting("constant");
  ExpectRefused(s, "async.staleness_exponent", "0 with staleness_weighting \"constant\"");
  s = good;
  s.set_strategy("scaffold");
  ExpectRefused(s, "strategy", "with an asynchronous job");
  s = good;
  s.mutable_aggregation()->set_rule("krum");
  s.mutable_aggregation()->set_byzantine_clients(1);
  s.mutable_aggregation()->set_selected(1);
  Status refused = wire::ValidateJobSpec(s);
  EXPECT_FALSE(refused.ok());
}

}  // namespace
}  // namespace tessera
