// The [selection] table of job.toml: the policy, its over-selection and the utility policy's
// straggler penalty, their defaults, the refusals with the key's line, the round trip through
// the writer, and the same limits on a spec that arrives over the wire.
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "cli/job_spec.h"
#include "proto/job_mapping.h"
#include "tests/cli/job_spec_expectations.h"

namespace tessera {
namespace {

using testing::ExpectError;
using testing::ExpectRefused;
using testing::kMinimal;
using testing::WireSpec;

Result<v1::JobSpec> Parse(const std::string& selection) {
  return ParseJobSpecString(std::string(kMinimal) + selection, "job.toml");
}

TEST(SelectionSpecTest, WithoutTheTableSelectionIsRandomWithoutOverSelection) {
  Result<v1::JobSpec> spec = Parse("");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_FALSE(spec->has_selection()) << "a spec without [selection] says nothing: today's behaviour";
  EXPECT_EQ(wire::SelectionPolicy(*spec), "random");
  EXPECT_EQ(wire::OverSelection(*spec), 0);
  EXPECT_EQ(wire::SelectionCount(*spec, 4), 4u);
  EXPECT_EQ(JobSpecToToml(*spec).find("[selection]"), std::string::npos);
}

TEST(SelectionSpecTest, EachPolicyGetsItsDefaultOverSelection) {
  Result<v1::JobSpec> deadline = Parse("[selection]\npolicy = \"deadline\"\n");
  ASSERT_TRUE(deadline.ok()) << deadline.status().ToString();
  EXPECT_EQ(deadline->selection().policy(), "deadline");
  ASSERT_TRUE(deadline->selection().has_over_selection());
  EXPECT_DOUBLE_EQ(deadline->selection().over_selection(), wire::kDefaultGuidedOverSelection);
  Result<v1::JobSpec> random = Parse("[selection]\npolicy = \"Random\"\n");
  ASSERT_TRUE(random.ok()) << random.status().ToString();
  EXPECT_EQ(random->selection().policy(), "random");
  EXPECT_DOUBLE_EQ(random->selection().over_selection(), 0);
  Result<v1::JobSpec> table_only = Parse("[selection]\nover_selection = 0.5\n");
  ASSERT_TRUE(table_only.ok()) << table_only.status().ToString();
  EXPECT_EQ(table_only->selection().policy(), "random");
  EXPECT_DOUBLE_EQ(table_only->selection().over_selection(), 0.5);
}

TEST(SelectionSpecTest, TheRoundSelectsTheCeilingOfClientsPerRoundTimesOnePlusOverSelection) {
  v1::JobSpec spec = WireSpec();
  spec.set_clients_per_round(10);
  spec.mutable_selection()->set_policy("deadline");
  spec.mutable_selection()->set_over_selection(0.3);
  EXPECT_EQ(wire::SelectionCount(spec, 100), 13u) << "10 x 1.3, exactly, despite binary fractions";
  EXPECT_EQ(wire::SelectionCount(spec, 11), 11u) << "at most the candidates";
  EXPECT_EQ(wire::SelectionCount(spec, 5), 5u);
  spec.set_clients_per_round(7);
  EXPECT_EQ(wire::SelectionCount(spec, 100), 10u) << "ceil(9.1)";
  spec.mutable_selection()->set_over_selection(0.01);
  EXPECT_EQ(wire::SelectionCount(spec, 100), 8u) << "ceil(7.07): any over-selection selects at least one more";
  spec.mutable_selection()->set_over_selection(0);
  EXPECT_EQ(wire::SelectionCount(spec, 100), 7u);
  spec.mutable_selection()->set_over_selection(1);
  EXPECT_EQ(wire::SelectionCount(spec, 100), 14u);
  spec.mutable_selection()->clear_over_selection();
  EXPECT_EQ(wire::SelectionCount(spec, 100), 10u) << "deadline's default, 0.3";
}

TEST(SelectionSpecTest, UnknownKeysPoliciesAndOutOfRangeFractionsAreRefusedWithTheirLine) {
  ExpectError(std::string(kMinimal) + "[selection]\npolicy = \"deadline\"\novershoot = 0.3\n",
              {"job.toml:11:1", "unknown key 'selection.overshoot'", "policy, over_selection"});
  ExpectError(std::string(kMinimal) + "[selection]\npolicy = \"fastest\"\n",
              {"job.toml:10:", "'selection.policy'", "\"random\", \"deadline\"", "\"fastest\""});
  ExpectError(std::string(kMinimal) + "[selection]\nover_selection = 1.5\n",
              {"job.toml:10:", "'selection.over_selection'", "[0, 1]", "1.5"});
  ExpectError(std::string(kMinimal) + "[selection]\nover_selection = -0.1\n",
              {"job.toml:10:", "'selection.over_selection'", "-0.1"});
  ExpectError(std::string(kMinimal) + "[selection]\nover_selection = \"30%\"\n",
              {"job.toml:10:", "'selection.over_selection'", "expected a float, found a string"});
  ExpectError(std::string(kMinimal) + "[selection]\nover_selection = nan\n",
              {"job.toml:10:", "'selection.over_selection'", "finite"});
  ExpectError(std::string(kMinimal) + "selection = \"deadline\"\n",
              {"job.toml:9:", "'data.partition.selection'"});  // under [data.partition]: not a top-level key
  ExpectError("selection = \"deadline\"\n" + std::string(kMinimal), {"job.toml:1:", "'selection'", "expected a table"});
}

TEST(SelectionSpecTest, TheWriterWritesWhatTheReaderReads) {
  for (const char* table : {"[selection]\npolicy = \"deadline\"\n", "[selection]\npolicy = \"deadline\"\nover_selection = 0\n",
                            "[selection]\npolicy = \"random\"\nover_selection = 0.25\n"}) {
    SCOPED_TRACE(table);
    Result<v1::JobSpec> spec = Parse(table);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    const std::string text = JobSpecToToml(*spec);
    Result<v1::JobSpec> again = ParseJobSpecString(text, "shown.toml");
    ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << text;
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*spec, *again)) << text;
  }
}

TEST(SelectionSpecTest, AWireSpecIsCheckedAlike) {
  v1::JobSpec s = WireSpec();
  s.mutable_selection()->set_policy("oort");
  ExpectRefused(s, "selection.policy", "\"random\", \"deadline\" or \"utility\"");
  s = WireSpec();
  s.mutable_selection()->set_policy(std::string(5000, 'x'));
  ExpectRefused(s, "selection.policy", "\"random\", \"deadline\" or \"utility\"");  // and not echoed whole (ExpectRefused's bound)
  for (double bad : {-0.5, 1.01, std::numeric_limits<double>::infinity(), std::nan("")}) {
    s = WireSpec();
    s.mutable_selection()->set_policy("deadline");
    s.mutable_selection()->set_over_selection(bad);
    ExpectRefused(s, "selection.over_selection", "a fraction in [0, 1]");
  }
  s = WireSpec();
  s.mutable_selection()->set_policy("deadline");  // over_selection unset: the policy's default
  EXPECT_TRUE(wire::ValidateJobSpec(s).ok());
  s.mutable_selection()->clear_policy();  // policy unset: random
  s.mutable_selection()->set_over_selection(1);
  EXPECT_TRUE(wire::ValidateJobSpec(s).ok());
  s.mutable_selection()->set_straggler_penalty(2);
  ExpectRefused(s, "selection.straggler_penalty", "no value for policy \"random\" (it applies to \"utility\")");
  s.mutable_selection()->set_policy("utility");
  EXPECT_TRUE(wire::ValidateJobSpec(s).ok());
  for (double bad : {-1.0, 10.5, std::nan("")}) {
    s.mutable_selection()->set_straggler_penalty(bad);
    ExpectRefused(s, "selection.straggler_penalty", "a number in [0, 10]");
  }
}

TEST(SelectionSpecTest, TheUtilityPolicyTakesAStragglerPenaltyAndNoOtherPolicyDoes) {
  Result<v1::JobSpec> utility = Parse("[selection]\npolicy = \"utility\"\n");
  ASSERT_TRUE(utility.ok()) << utility.status().ToString();
  EXPECT_EQ(utility->selection().policy(), "utility");
  EXPECT_DOUBLE_EQ(utility->selection().over_selection(), wire::kDefaultGuidedOverSelection);
  EXPECT_DOUBLE_EQ(utility->selection().straggler_penalty(), wire::kDefaultStragglerPenalty);
  Result<v1::JobSpec> alpha = Parse("[selection]\npolicy = \"utility\"\nstraggler_penalty = 0.5\n");
  ASSERT_TRUE(alpha.ok()) << alpha.status().ToString();
  EXPECT_DOUBLE_EQ(alpha->selection().straggler_penalty(), 0.5);
  const std::string text = JobSpecToToml(*alpha);
  Result<v1::JobSpec> again = ParseJobSpecString(text, "shown.toml");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << text;
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*alpha, *again)) << text;
  ExpectError(std::string(kMinimal) + "[selection]\npolicy = \"deadline\"\nstraggler_penalty = 2\n",
              {"job.toml:11:", "'selection.straggler_penalty'", "applies to policy \"utility\" only", "\"deadline\""});
  ExpectError(std::string(kMinimal) + "[selection]\npolicy = \"utility\"\nstraggler_penalty = 11\n",
              {"job.toml:11:", "'selection.straggler_penalty'", "[0, 10]", "11"});
}

}  // namespace
}  // namespace tessera
