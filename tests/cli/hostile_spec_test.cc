// Job specs as hostile input: a layer's keys apply to its type only and never to one another,
// values come back escaped and bounded in errors, and only a regular file of bounded size is
// read.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "base/escape.h"
#include "job_spec_expectations.h"

namespace tessera {
namespace {

using testing::ExpectError;
using testing::kMinimal;

// The declared model below the minimal spec's keys, with `layers` as [[model.layers]] entries.
std::string Declared(const std::string& layers) {
  return "name = \"t\"\nrounds = 5\n\n[data.partition]\nparties = 4\n\n[model]\nlayers = [" + layers + "]\n";
}

// `bias = true` on a layer once also set `local`, FedBN's keep-it-local switch.
TEST(HostileSpecTest, ALayersBiasAndLocalAreEachTheirOwn) {
  Result<v1::JobSpec> spec = ParseJobSpecString(
      Declared("{ type = \"conv2d\", out = 8, kernel = 3, bias = true }, { type = \"batch_norm\", name = \"bn1\" }, "
               "{ type = \"flatten\" }, { type = \"linear\" }"),
      "job.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  ASSERT_EQ(spec->model().layers_size(), 4);
  EXPECT_TRUE(spec->model().layers(0).bias());
  EXPECT_FALSE(spec->model().layers(0).local());
  EXPECT_FALSE(spec->model().layers(1).local());
  Result<v1::JobSpec> local = ParseJobSpecString(
      Declared("{ type = \"conv2d\", out = 8, kernel = 3 }, { type = \"batch_norm\", local = true }, "
               "{ type = \"flatten\" }, { type = \"linear\" }"),
      "job.toml");
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  EXPECT_TRUE(local->model().layers(1).local());
  EXPECT_FALSE(local->model().layers(0).local());
}

// Each key of a layer is refused on a type it does not apply to (docs/JOBS.md), naming the key,
// the types it applies to and the layer's type.
TEST(HostileSpecTest, ALayersKeysApplyToItsTypeOnly) {
  ExpectError(Declared("{ type = \"relu\", out = 7 }"),
              {"job.toml:", "'model.layers[0].out'", "applies to conv2d, linear only; this layer is \"relu\""});
  ExpectError(Declared("{ type = \"flatten\", name = \"zzz\" }"), {"'model.layers[0].name'", "\"flatten\""});
  ExpectError(Declared("{ type = \"flatten\", stride = 4 }"), {"'model.layers[0].stride'", "conv2d, max_pool, avg_pool"});
  ExpectError(Declared("{ type = \"conv2d\", out = 8, kernel = 3, local = true }"),
              {"'model.layers[0].local'", "applies to batch_norm only"});
  ExpectError(Declared("{ type = \"conv2d\", out = 8, kernel = 3, window = 9 }"), {"'model.layers[0].window'"});
  ExpectError(Declared("{ type = \"conv2d\", out = 8, kernel = 3, epsilon = 0.5 }"), {"'model.layers[0].epsilon'"});
  ExpectError(Declared("{ type = \"relu\", probability = 0.5 }"), {"'model.layers[0].probability'", "dropout"});
  ExpectError(Declared("{ type = \"batch_norm\", bias = false }"), {"'model.layers[0].bias'", "conv2d, linear"});
  ExpectError(Declared("{ type = \"layer_norm\", momentum = 0.3 }"), {"'model.layers[0].momentum'", "batch_norm"});
  ExpectError(Declared("{ type = \"residual\", body = [{ type = \"relu\", kernel = 3 }] }"),
              {"'model.layers[0].body[0].kernel'"});
}

// A value that is not one of a key's choices, and an unknown key, come back escaped and cut.
TEST(HostileSpecTest, ValuesAndKeysInErrorsAreEscapedAndBounded) {
  const std::string forged = "fed\\u001b[31mRED\\nFAKE LOG LINE";
  for (const std::string& text : {"strategy = \"" + forged + "\"\n" + kMinimal,
                                  std::string(kMinimal) + "[data]\nformat = \"" + forged + "\"\n",
                                  "device = \"" + forged + "\"\n" + kMinimal,
                                  "\"key\\u001b[2J\" = 1\n" + std::string(kMinimal)}) {
    Result<v1::JobSpec> spec = ParseJobSpecString(text, "job.toml");
    ASSERT_FALSE(spec.ok()) << text;
    const std::string& message = spec.status().message();
    EXPECT_EQ(message.find('\x1b'), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_NE(message.find("\\x1b"), std::string::npos) << message;
  }
  Result<v1::JobSpec> huge = ParseJobSpecString("strategy = \"" + std::string(5 << 20, 'x') + "\"\n" + kMinimal, "job.toml");
  ASSERT_FALSE(huge.ok());
  EXPECT_LT(huge.status().message().size(), 1000u);
  EXPECT_NE(huge.status().message().find("(5242880 bytes)"), std::string::npos) << huge.status().message().substr(0, 300);
}

// A TOML syntax error quotes what the parser saw: a character that reorders text (U+202E) or
// a C1 control there is escaped, as in every other message, and a plain one is kept as it is.
TEST(HostileSpecTest, ASyntaxErrorShowsWhatItSawEscaped) {
  const std::string reorder = "\xe2\x80\xae";  // U+202E, right-to-left override
  for (const std::string& text : {std::string(kMinimal) + "x = 1 " + reorder + "\n",
                                  "[" + reorder + "x]\n" + std::string(kMinimal),
                                  "\"" + reorder + "k\" = 1\n\"" + reorder + "k\" = 2\n" + std::string(kMinimal),
                                  std::string(kMinimal) + "x = 1 \xc2\x9b\n"}) {
    Result<v1::JobSpec> spec = ParseJobSpecString(text, "job.toml");
    ASSERT_FALSE(spec.ok()) << text;
    const std::string& message = spec.status().message();
    EXPECT_FALSE(HasHiddenCharacters(message)) << message;
    EXPECT_NE(message.find("job.toml:"), std::string::npos) << message;
  }
  ExpectError("[data\n" + std::string(kMinimal), {"job.toml:1:6: Error while parsing table header"});
}

// A number in a message is the value given, never rounded; one beyond float's range is refused
// with its value, not as "inf".
TEST(HostileSpecTest, NumbersInErrorsAreTheValuesGiven) {
  ExpectError("round_deadline_s = 604800.0004\n" + std::string(kMinimal),
              {"'round_deadline_s'", "got 604800.0004"});
  ExpectError(std::string(kMinimal) + "[data]\nmean = [1e300]\nstd = [1.0]\n",
              {"'data.mean[0]'", "float's range", "got 1e+300"});
  ExpectError(std::string(kMinimal) + "[data]\nmean = [0.5]\nstd = [-1e39]\n", {"'data.std[0]'", "got -1e+39"});
}

// What the coordinator's checks refuse comes back pointing at the key as the file writes it:
// [train]'s keys are the wire's optimizer fields, and a rule written as `aggregation = "median"`
// is the wire's aggregation.rule.
TEST(HostileSpecTest, ACoordinatorCheckNamesTheKeyOfTheFile) {
  ExpectError("strategy = \"scaffold\"\n" + std::string(kMinimal) + "\n[train]\nlearning_rate = 1e-7\n",
              {"job.toml:12:17: key 'train.learning_rate': spec.optimizer.learning_rate: expected at least 1e-6"});
  ExpectError("strategy = \"fednova\"\naggregation = \"median\"\n" + std::string(kMinimal),
              {"job.toml:2:15: key 'aggregation': spec.aggregation.rule: expected \"mean\" for strategy \"fednova\""});
  ExpectError("mode = \"async\"\n" + std::string(kMinimal) + "\n[aggregation]\nrule = \"median\"\n",
              {"job.toml:12:8: spec.aggregation.rule: expected \"mean\" with an asynchronous job"});
  // A field the file left at its default points at the table that holds it.
  ExpectError("clients_per_round = 2\n" + std::string(kMinimal) + "\n[aggregation]\nrule = \"trimmed-mean\"\n",
              {"job.toml:11:1: key 'aggregation': spec.aggregation.trim_fraction: expected a fraction that cuts"});
}

// A layer's probability and epsilon are used as floats: a value in range as a double that
// rounds out of it as a float (to 1, to 0) is refused at its key with the value given.
TEST(HostileSpecTest, ALayersNumbersAreCheckedAsTheFloatsTheyBecome) {
  ExpectError(Declared("{ type = \"flatten\" }, { type = \"dropout\", probability = 0.99999999 }, { type = \"linear\" }"),
              {"job.toml:8:", "key 'model.layers[1].probability'", "below 1 as a float", "got 0.99999999"});
  ExpectError(Declared("{ type = \"flatten\" }, { type = \"layer_norm\", epsilon = 1e-50 }, { type = \"linear\" }"),
              {"job.toml:8:", "key 'model.layers[1].epsilon'", "above 0 as a float", "got 1e-50"});
  Result<v1::JobSpec> spec = ParseJobSpecString(
      Declared("{ type = \"flatten\" }, { type = \"dropout\", probability = 0.9999999 }, { type = \"layer_norm\", "
               "epsilon = 1e-30 }, { type = \"linear\" }"),
      "job.toml");
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
}

// Only a regular file of at most kMaxJobSpecBytes is read; the path in the message is escaped.
TEST(HostileSpecTest, OnlyARegularFileOfBoundedSizeIsRead) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tessera-hostile-spec-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  Result<v1::JobSpec> directory = ParseJobSpecFile(dir.string());
  EXPECT_EQ(directory.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(directory.status().message().find("expected a regular file"), std::string::npos)
      << directory.status().message();
  Result<v1::JobSpec> device = ParseJobSpecFile("/dev/zero");
  EXPECT_EQ(device.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(device.status().message().find("expected a regular file"), std::string::npos) << device.status().message();

  const std::filesystem::path large = dir / "large.toml";
  {
    std::ofstream out(large, std::ios::binary);
    out << kMinimal << "# " << std::string(kMaxJobSpecBytes, 'c') << "\n";
  }
  Result<v1::JobSpec> too_large = ParseJobSpecFile(large.string());
  EXPECT_EQ(too_large.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_large.status().message().find("expected at most 1024 KiB"), std::string::npos)
      << too_large.status().message();

  Result<v1::JobSpec> missing = ParseJobSpecFile((dir / "no\nsuch.toml").string());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("no\\nsuch.toml"), std::string::npos) << missing.status().message();
  EXPECT_NE(missing.status().message().find("No such file or directory"), std::string::npos)
      << missing.status().message();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera
