// The strategies' options in a job spec: [server] for the server optimisers, [aggregation]
// for the robust rules, and what cannot apply to a strategy, in job.toml and over the wire.
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

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

// kMinimal with ten parties and `lines` added at the top level (before any table).
std::string TenParties(const std::string& lines, const std::string& tables = "") {
  return lines + "name = \"t\"\nrounds = 5\n[model]\nname = \"mlp\"\n[data.partition]\nparties = 10\n" + tables;
}

Result<v1::JobSpec> Parse(const std::string& text) { return ParseJobSpecString(text, "job.toml"); }

TEST(ServerOptimizerSpecTest, TheAdaptiveStrategiesGetTheirDefaults) {
  for (const char* strategy : {"fedadam", "FedYogi", "fedadagrad"}) {
    SCOPED_TRACE(strategy);
    Result<v1::JobSpec> spec = Parse(TenParties(std::string("strategy = \"") + strategy + "\"\n"));
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    const auto& server = spec->server();
    EXPECT_DOUBLE_EQ(server.learning_rate(), spec->strategy() == "fedadagrad" ? 0.3 : 0.03);
    EXPECT_TRUE(server.has_beta1());
    EXPECT_DOUBLE_EQ(server.beta1(), 0.9);
    EXPECT_EQ(server.has_beta2(), spec->strategy() != "fedadagrad");  // Adagrad has no beta2
    if (server.has_beta2()) {
      EXPECT_DOUBLE_EQ(server.beta2(), 0.99);
    }
    EXPECT_DOUBLE_EQ(server.tau(), 1e-3);
    EXPECT_DOUBLE_EQ(server.momentum(), 0);
    EXPECT_TRUE(wire::ValidateJobSpec(*spec).ok());
  }
  Result<v1::JobSpec> set = Parse(TenParties("strategy = \"fedyogi\"\n",
                                             "[server]\nlearning_rate = 0.05\nbeta1 = 0\nbeta2 = 0.999\ntau = 1e-9\n"));
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_DOUBLE_EQ(set->server().learning_rate(), 0.05);
  EXPECT_TRUE(set->server().has_beta1());
  EXPECT_DOUBLE_EQ(set->server().beta1(), 0);
  EXPECT_DOUBLE_EQ(set->server().beta2(), 0.999);
  EXPECT_DOUBLE_EQ(set->server().tau(), 1e-9);
}

TEST(ServerOptimizerSpecTest, AnOptionOfAnotherStrategyOrOutOfRangeIsRefusedWithItsLine) {
  const std::string adam = "strategy = \"fedadam\"\n";
  ExpectError(TenParties(adam, "[server]\nmomentum = 0.9\n"),
              {"job.toml:9:", "'server.momentum'", "applies to strategies \"fedavgm\" only; strategy is \"fedadam\""});
  ExpectError(TenParties("strategy = \"fedavgm\"\n", "[server]\ntau = 0.01\n"),
              {"job.toml:9:", "'server.tau'", "\"fedadam\", \"fedyogi\" and \"fedadagrad\" only"});
  ExpectError(TenParties("strategy = \"fedadagrad\"\n", "[server]\nbeta2 = 0.9\n"),
              {"job.toml:9:", "'server.beta2'", "\"fedadam\" and \"fedyogi\" only; strategy is \"fedadagrad\""});
  ExpectError(TenParties(adam, "[server]\nbeta1 = 1\n"), {"job.toml:9:", "'server.beta1'", "[0, 1)"});
  ExpectError(TenParties(adam, "[server]\nbeta2 = -0.1\n"), {"job.toml:9:", "'server.beta2'", "[0, 1)"});
  ExpectError(TenParties(adam, "[server]\ntau = 0\n"), {"job.toml:9:", "'server.tau'", "> 0 and at most 1"});
  ExpectError(TenParties(adam, "[server]\nlearning_rate = 5000\n"), {"job.toml:9:", "'server.learning_rate'", "(0, 1000]"});
  ExpectError(TenParties(adam, "[server]\nepsilon = 1e-8\n"), {"'server.epsilon'", "beta1, beta2, tau"});
  ExpectError(TenParties("strategy = \"fedsgd\"\n"), {"job.toml:1:", "'strategy'", "\"fedadagrad\""});
}

TEST(ServerOptimizerSpecTest, StrategiesThatAggregateInTheirOwnWayTakeNoRuleNorServerOptions) {
  v1::JobSpec s = WireSpec();
  s.set_strategy("fednova");
  s.mutable_aggregation()->set_rule("median");
  ExpectRefused(s, "aggregation.rule", "\"mean\" for strategy \"fednova\"");
  s = WireSpec();
  s.set_strategy("scaffold");
  s.mutable_server()->set_learning_rate(0.5);
  ExpectRefused(s, "server", "no server options for strategy \"scaffold\"");
  // Its variates' bound is max_update_norm / learning_rate: a rate that makes it unbounded in
  // a float is refused; the smallest allowed passes.
  s = WireSpec();
  s.set_strategy("scaffold");
  s.mutable_optimizer()->set_learning_rate(1e-30);
  ExpectRefused(s, "optimizer.learning_rate", "at least 1e-6 for strategy \"scaffold\"");
  s.mutable_optimizer()->set_learning_rate(1e-6);
  EXPECT_TRUE(wire::ValidateJobSpec(s).ok()) << wire::ValidateJobSpec(s).ToString();
  // FedProx's server side is FedAvg's, so a robust rule applies to it.
  s = WireSpec();
  s.set_strategy("fedprox");
  s.set_proximal_mu(0.01);
  s.mutable_aggregation()->set_rule("median");
  EXPECT_TRUE(wire::ValidateJobSpec(s).ok()) << wire::ValidateJobSpec(s).ToString();
  // The client side of these algorithms runs in native training: no external trainer takes it.
  s.mutable_model()->set_trainer("pytorch");
  ExpectRefused(s, "model.trainer", "no external trainer with strategy \"fedprox\"");
  s = WireSpec();
  s.mutable_model()->set_trainer("Py Torch");
  ExpectRefused(s, "model.trainer", "[a-z0-9._-]");
}

TEST(ServerOptimizerSpecTest, AWireSpecIsCheckedAlike) {
  Result<v1::JobSpec> adam = Parse(TenParties("strategy = \"fedadam\"\n"));
  ASSERT_TRUE(adam.ok());
  v1::JobSpec s = *adam;
  s.mutable_server()->set_tau(-1);
  ExpectRefused(s, "server.tau", "[0, 1] (0: the default, 0.001)");
  s = *adam;
  s.mutable_server()->set_beta2(1);
  ExpectRefused(s, "server.beta2", "[0, 1)");
  s = *adam;
  s.mutable_server()->set_momentum(0.5);
  ExpectRefused(s, "server.momentum", "no value for strategy \"fedadam\" (it applies to fedavgm)");
  s = *adam;
  s.set_strategy("fedadagrad");
  ExpectRefused(s, "server.beta2", "(it applies to fedadam and fedyogi)");
  s = *adam;
  s.set_strategy("fedavgm");
  ExpectRefused(s, "server.beta1", "no value for strategy \"fedavgm\"");
  s = *adam;
  s.set_strategy("fedavg");
  ExpectRefused(s, "server", "no server options for strategy \"fedavg\"");
  s = *adam;
  s.set_strategy("fedsgd");
  ExpectRefused(s, "strategy", "one of fedavg, fedavgm, fedadam, fedyogi, fedadagrad, fedprox, fednova, scaffold");
  s = *adam;
  s.set_strategy("fedprox");
  s.set_proximal_mu(0.01);
  ExpectRefused(s, "server", "no server options for strategy \"fedprox\"");
  // Unset options are the defaults: a bare adaptive strategy over the wire is valid.
  s = WireSpec();
  s.set_strategy("fedyogi");
  EXPECT_TRUE(wire::ValidateJobSpec(s).ok()) << wire::ValidateJobSpec(s).ToString();
}

TEST(AggregationSpecTest, ARuleAsANameOrAsATableWithItsOptions) {
  Result<v1::JobSpec> plain = Parse(TenParties(""));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->aggregation().rule(), "mean");
  EXPECT_EQ(plain->update_norm_policy(), "refuse");

  Result<v1::JobSpec> median = Parse(TenParties("aggregation = \"Median\"\n"));
  ASSERT_TRUE(median.ok()) << median.status().ToString();
  EXPECT_EQ(median->aggregation().rule(), "median");

  Result<v1::JobSpec> trimmed = Parse(TenParties("", "[aggregation]\nrule = \"trimmed-mean\"\n"));
  ASSERT_TRUE(trimmed.ok()) << trimmed.status().ToString();
  EXPECT_DOUBLE_EQ(trimmed->aggregation().trim_fraction(), 0.2);  // the default
  trimmed = Parse(TenParties("", "[aggregation]\nrule = \"trimmed-mean\"\ntrim_fraction = 0.3\n"));
  ASSERT_TRUE(trimmed.ok()) << trimmed.status().ToString();
  EXPECT_DOUBLE_EQ(trimmed->aggregation().trim_fraction(), 0.3);

  Result<v1::JobSpec> krum =
      Parse(TenParties("strategy = \"fedadam\"\nupdate_norm_policy = \"clip\"\n",
                       "[aggregation]\nrule = \"krum\"\nbyzantine_clients = 2\nselected = 4\n"));
  ASSERT_TRUE(krum.ok()) << krum.status().ToString();
  EXPECT_EQ(krum->aggregation().byzantine_clients(), 2u);
  EXPECT_EQ(krum->aggregation().selected(), 4u);
  EXPECT_EQ(krum->update_norm_policy(), "clip");
  EXPECT_TRUE(wire::ValidateJobSpec(*krum).ok());

  // Shown and read back, each is the same spec.
  for (const v1::JobSpec* spec : {&*plain, &*median, &*trimmed, &*krum}) {
    const std::string text = JobSpecToToml(*spec);
    Result<v1::JobSpec> again = ParseJobSpecString(text, "shown.toml");
    ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << text;
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*spec, *again)) << text;
  }
}

TEST(AggregationSpecTest, WhatCannotApplyIsRefusedNamingTheKey) {
  ExpectError(TenParties("aggregation = \"mode\"\n"),
              {"job.toml:1:", "'aggregation'", "\"mean\", \"median\", \"trimmed-mean\", \"krum\""});
  ExpectError(TenParties("aggregation = 3\n"), {"job.toml:1:", "'aggregation'", "a string) or an [aggregation] table"});
  ExpectError(TenParties("", "[aggregation]\nrule = \"median\"\ntrim_fraction = 0.2\n"),
              {"job.toml:9:", "'aggregation.trim_fraction'", "\"trimmed-mean\" only; rule is \"median\""});
  ExpectError(TenParties("", "[aggregation]\nrule = \"trimmed-mean\"\nselected = 2\n"),
              {"job.toml:9:", "'aggregation.selected'", "\"krum\" only"});
  ExpectError(TenParties("", "[aggregation]\nrule = \"trimmed-mean\"\ntrim_fraction = 0.5\n"),
              {"job.toml:9:", "'aggregation.trim_fraction'", "below 0.5"});
  ExpectError(TenParties("", "[aggregation]\nrule = \"krum\"\n"),
              {"'aggregation.byzantine_clients'", "is required for rule \"krum\""});
  ExpectError(TenParties("aggregation = \"krum\"\n"), {"'aggregation.byzantine_clients'", "is required"});
  ExpectError(TenParties("", "[aggregation]\nrule = \"krum\"\nbyzantine_clients = 2\nbyzantine = 1\n"),
              {"'aggregation.byzantine'", "rule, trim_fraction, byzantine_clients, selected"});
  // Krum's condition n > 2f + 2 for the fewest updates a round may close with: with
  // min_clients 10, f may be at most 3.
  ExpectError(TenParties("", "[aggregation]\nrule = \"krum\"\nbyzantine_clients = 4\n"),
              {"job.toml:9:", "spec.aggregation.byzantine_clients: expected f with min_clients (10) > 2f + 2",
               "at most 3, got 4"});
  EXPECT_TRUE(Parse(TenParties("", "[aggregation]\nrule = \"krum\"\nbyzantine_clients = 3\n")).ok());
  ExpectError(TenParties("min_clients = 6\n", "[aggregation]\nrule = \"krum\"\nbyzantine_clients = 2\n"),
              {"job.toml:10:", "spec.aggregation.byzantine_clients", "min_clients (6)", "at most 1, got 2"});
  ExpectError(TenParties("", "[aggregation]\nrule = \"krum\"\nbyzantine_clients = 3\nselected = 8\n"),
              {"job.toml:10:", "spec.aggregation.selected: expected at most min_clients - byzantine_clients (7), got 8"});
  ExpectError(TenParties("min_clients = 2\n", "[aggregation]\nrule = \"krum\"\nbyzantine_clients = 0\n"),
              {"spec.min_clients: expected at least 3 for rule \"krum\"", "got 2"});
  // A trim that cuts nothing from a full round: 0.05 of 10 clients.
  ExpectError(TenParties("", "[aggregation]\nrule = \"trimmed-mean\"\ntrim_fraction = 0.05\n"),
              {"job.toml:9:", "spec.aggregation.trim_fraction: expected a fraction that cuts at least one update",
               "at least 1/10, got 0.05"});
  ExpectError(TenParties("update_norm_policy = \"ignore\"\n"),
              {"job.toml:1:", "'update_norm_policy'", "\"refuse\", \"clip\""});
}

TEST(AggregationSpecTest, ARobustRuleMustBeAbleToHoldEveryUpdateOfARound) {
  // An MLP of [4096, 4096] (20.0 million parameters, 80 MB) fits the coordinator, but 20
  // clients' copies of it (1.5 GiB) exceed the 1 GiB a robust rule may hold.
  v1::JobSpec s = WireSpec();
  s.mutable_model()->set_name("mlp");
  s.mutable_model()->add_hidden(4096);
  s.mutable_model()->add_hidden(4096);
  s.mutable_data()->mutable_partition()->set_parties(20);
  s.set_clients_per_round(20);
  s.set_min_clients(20);
  EXPECT_TRUE(wire::ValidateJobSpec(s).ok());
  s.mutable_aggregation()->set_rule("median");
  ExpectRefused(s, "aggregation.rule", "keeps every update until the round closes");
  Status refused = wire::ValidateJobSpec(s);
  EXPECT_NE(refused.message().find("within 1024 MiB, got 20 clients x 20037642 parameters (1528.75 MiB)"),
            std::string::npos)
      << refused.message();
  s.set_clients_per_round(13);  // 994 MiB
  s.set_min_clients(13);
  EXPECT_TRUE(wire::ValidateJobSpec(s).ok()) << wire::ValidateJobSpec(s).ToString();
  // Over-selected, 17 clients are sent the round, and the updates of all of them may be in
  // hand when it closes: 1299.5 MiB.
  s.mutable_selection()->set_over_selection(0.3);
  ExpectRefused(s, "aggregation.rule", "keeps every update until the round closes");
  refused = wire::ValidateJobSpec(s);
  EXPECT_NE(refused.message().find("got 17 clients selected (clients_per_round 13 with over_selection)"),
            std::string::npos)
      << refused.message();
}

TEST(AggregationSpecTest, KrumsDistancesCountInWhatARoundHolds) {
  // An MLP 784-10-10 (7,960 parameters): 10,000 clients' updates are 304 MiB, which a median
  // holds; Krum's matrix of distances between them adds 763 MiB, past the 1 GiB. 5,000 fit.
  v1::JobSpec s = WireSpec();
  s.mutable_model()->set_name("mlp");
  s.mutable_model()->clear_hidden();
  s.mutable_model()->add_hidden(10);
  s.mutable_data()->mutable_partition()->set_parties(10000);
  s.set_clients_per_round(10000);
  s.set_min_clients(10000);
  s.mutable_aggregation()->set_rule("median");
  EXPECT_TRUE(wire::ValidateJobSpec(s).ok()) << wire::ValidateJobSpec(s).ToString();
  s.mutable_aggregation()->set_rule("krum");
  ExpectRefused(s, "aggregation.rule", "and Krum's distances, clients^2 x 8 bytes");
  s.set_clients_per_round(5000);
  s.set_min_clients(5000);
  EXPECT_TRUE(wire::ValidateJobSpec(s).ok()) << wire::ValidateJobSpec(s).ToString();
}

TEST(AggregationSpecTest, AWireSpecIsCheckedAlike) {
  v1::JobSpec s = WireSpec();  // four clients
  s.mutable_aggregation()->set_rule("Median");
  ExpectRefused(s, "aggregation.rule", "\"mean\", \"median\", \"trimmed-mean\" or \"krum\"");
  s = WireSpec();
  s.mutable_aggregation()->set_rule("mean");
  s.mutable_aggregation()->set_byzantine_clients(1);
  ExpectRefused(s, "aggregation.byzantine_clients", "no value for rule \"mean\" (it applies to krum)");
  s = WireSpec();
  s.mutable_aggregation()->set_rule("trimmed-mean");
  s.mutable_aggregation()->set_trim_fraction(std::numeric_limits<double>::quiet_NaN());
  ExpectRefused(s, "aggregation.trim_fraction", "[0, 0.5)");
  s.mutable_aggregation()->set_trim_fraction(0);  // the default 0.2 of 4 clients cuts nothing
  ExpectRefused(s, "aggregation.trim_fraction", "at least 1/4, got 0.2");
  s.mutable_aggregation()->set_trim_fraction(0.25);
  EXPECT_TRUE(wire::ValidateJobSpec(s).ok());
  s = WireSpec();
  s.mutable_aggregation()->set_rule("krum");
  s.mutable_aggregation()->set_byzantine_clients(4000000000u);
  ExpectRefused(s, "aggregation.byzantine_clients", "min_clients (4) > 2f + 2");
  s.mutable_aggregation()->set_byzantine_clients(0);
  s.mutable_aggregation()->set_selected(4000000000u);
  ExpectRefused(s, "aggregation.selected", "at most min_clients - byzantine_clients (4)");
  s = WireSpec();
  s.set_update_norm_policy("CLIP");
  ExpectRefused(s, "update_norm_policy", "\"refuse\" or \"clip\"");
}

}  // namespace
}  // namespace tessera
