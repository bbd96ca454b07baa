// [compression] in a job spec: the encodings, top-k's fraction, unknown keys, and where
// compression cannot apply, in job.toml and over the wire.
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
using testing::WireSpec;

// A spec of ten parties with `top` lines at the top level and `tables` after it.
std::string Spec(const std::string& top, const std::string& tables) {
  return top + "name = \"t\"\nrounds = 5\n[model]\nname = \"mlp\"\n[data.partition]\nparties = 10\n" + tables;
}

Result<v1::JobSpec> Parse(const std::string& text) { return ParseJobSpecString(text, "job.toml"); }

TEST(CompressionSpecTest, EachEncodingIsReadAndWrittenBack) {
  Result<v1::JobSpec> plain = Parse(Spec("", ""));
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_FALSE(plain->has_compression());
  EXPECT_EQ(wire::JobUpdateEncoding(*plain), UpdateEncoding::kFloat32);
  EXPECT_EQ(wire::TopKFraction(*plain), 0);

  const std::pair<const char*, v1::Encoding> encodings[] = {{"float32", v1::ENCODING_FLOAT32},
                                                            {"Float16", v1::ENCODING_FLOAT16},
                                                            {"bfloat16", v1::ENCODING_BFLOAT16},
                                                            {"int8", v1::ENCODING_INT8}};
  std::vector<v1::JobSpec> specs;
  for (const auto& [name, encoding] : encodings) {
    SCOPED_TRACE(name);
    Result<v1::JobSpec> spec = Parse(Spec("", std::string("[compression]\nencoding = \"") + name + "\"\n"));
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    EXPECT_EQ(spec->compression().encoding(), encoding);
    EXPECT_EQ(spec->compression().fraction(), 0);
    specs.push_back(*spec);
  }
  Result<v1::JobSpec> topk = Parse(Spec("", "[compression]\nencoding = \"topk\"\nfraction = 0.01\n"));
  ASSERT_TRUE(topk.ok()) << topk.status().ToString();
  EXPECT_EQ(topk->compression().encoding(), v1::ENCODING_TOPK);
  EXPECT_DOUBLE_EQ(topk->compression().fraction(), 0.01);
  EXPECT_EQ(wire::JobUpdateEncoding(*topk), UpdateEncoding::kTopK);
  EXPECT_DOUBLE_EQ(wire::TopKFraction(*topk), 0.01);
  specs.push_back(*topk);
  Result<v1::JobSpec> whole = Parse(Spec("", "[compression]\nencoding = \"topk\"\nfraction = 1\n"));
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  // Dense encodings go with a robust rule.
  Result<v1::JobSpec> median = Parse(Spec("aggregation = \"median\"\n", "[compression]\nencoding = \"int8\"\n"));
  ASSERT_TRUE(median.ok()) << median.status().ToString();
  specs.push_back(*median);

  for (const v1::JobSpec& spec : specs) {
    const std::string text = JobSpecToToml(spec);
    Result<v1::JobSpec> again = ParseJobSpecString(text, "shown.toml");
    ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << text;
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(spec, *again)) << text;
  }
}

TEST(CompressionSpecTest, WhatCannotApplyIsRefusedNamingTheKey) {
  ExpectError(Spec("", "[compression]\nencoding = \"fp8\"\n"),
              {"job.toml:8:", "'compression.encoding'", "\"float32\", \"float16\", \"bfloat16\", \"int8\", \"topk\"",
               "found \"fp8\""});
  ExpectError(Spec("", "[compression]\nencoding = \"topk\"\nfraction = 0.01\nerror_feedback = false\n"),
              {"job.toml:10:", "unknown key 'compression.error_feedback'", "allowed keys in [compression]: encoding, fraction"});
  ExpectError(Spec("", "[compression]\nencoding = \"topk\"\n"),
              {"'compression.fraction'", "is required for encoding \"topk\""});
  for (const char* fraction : {"0", "-0.1", "1.5"}) {
    ExpectError(Spec("", std::string("[compression]\nencoding = \"topk\"\nfraction = ") + fraction + "\n"),
                {"job.toml:9:", "'compression.fraction'", "must be in (0, 1]"});
  }
  ExpectError(Spec("", "[compression]\nencoding = \"int8\"\nfraction = 0.1\n"),
              {"job.toml:9:", "'compression.fraction'", "applies to encoding \"topk\" only; encoding is \"int8\""});
  ExpectError(Spec("", "[compression]\nencoding = 8\n"), {"'compression.encoding'", "a string"});
  ExpectError(Spec("compression = \"int8\"\n", ""), {"'compression'", "a table"});
  // SCAFFOLD's variates need the exact delta; a robust rule over sparse updates.
  ExpectError(Spec("strategy = \"scaffold\"\n", "[compression]\nencoding = \"float16\"\n"),
              {"spec.compression.encoding: expected \"float32\" for strategy \"scaffold\""});
  ExpectError(Spec("aggregation = \"trimmed-mean\"\n", "[compression]\nencoding = \"topk\"\nfraction = 0.1\n"),
              {"spec.compression.encoding: expected a dense encoding with aggregation rule \"trimmed-mean\""});
  Result<v1::JobSpec> scaffold = Parse(Spec("strategy = \"scaffold\"\n", "[compression]\nencoding = \"float32\"\n"));
  EXPECT_TRUE(scaffold.ok()) << scaffold.status().ToString();
}

// examples/fmnist-{float16,int8,topk}.toml: the demo with its updates compressed, nothing else.
TEST(CompressionSpecTest, TheExamplesAreTheDemoWithCompressedUpdates) {
  const std::string examples = std::string(TESSERA_SOURCE_DIR) + "/examples/";
  Result<v1::JobSpec> demo = ParseJobSpecFile(examples + "fmnist-fedavg.toml");
  ASSERT_TRUE(demo.ok()) << demo.status().ToString();
  const std::pair<const char*, v1::Encoding> cases[] = {
      {"float16", v1::ENCODING_FLOAT16}, {"int8", v1::ENCODING_INT8}, {"topk", v1::ENCODING_TOPK}};
  for (const auto& [name, encoding] : cases) {
    SCOPED_TRACE(name);
    Result<v1::JobSpec> spec = ParseJobSpecFile(examples + "fmnist-" + name + ".toml");
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    EXPECT_EQ(spec->name(), std::string("fmnist-") + name);
    EXPECT_EQ(spec->compression().encoding(), encoding);
    EXPECT_DOUBLE_EQ(spec->compression().fraction(), encoding == v1::ENCODING_TOPK ? 0.01 : 0.0);
    v1::JobSpec rest = *spec;
    rest.set_name(demo->name());
    rest.clear_compression();
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(rest, *demo)) << JobSpecToToml(rest);
  }
}

TEST(CompressionSpecTest, TheCoordinatorChecksTheWireSpecAlike) {
  v1::JobSpec spec = WireSpec();
  spec.mutable_compression()->set_encoding(static_cast<v1::Encoding>(42));
  ExpectRefused(spec, "compression.encoding", "one of \"float32\"");
  spec = WireSpec();
  spec.mutable_compression()->set_encoding(v1::ENCODING_TOPK);
  ExpectRefused(spec, "compression.fraction", "a number in (0, 1] for encoding \"topk\"");
  spec.mutable_compression()->set_fraction(std::numeric_limits<double>::quiet_NaN());
  ExpectRefused(spec, "compression.fraction", "a number in (0, 1]");
  spec.mutable_compression()->set_fraction(0.05);
  EXPECT_TRUE(wire::ValidateJobSpec(spec).ok());
  spec.mutable_compression()->set_encoding(v1::ENCODING_BFLOAT16);
  ExpectRefused(spec, "compression.fraction", "no value for encoding \"bfloat16\"");
  spec.mutable_compression()->set_fraction(0);
  EXPECT_TRUE(wire::ValidateJobSpec(spec).ok());
  spec.set_strategy("scaffold");
  ExpectRefused(spec, "compression.encoding", "\"float32\" for strategy \"scaffold\"");
  spec.set_strategy("fedavg");
  spec.mutable_compression()->set_encoding(v1::ENCODING_TOPK);
  spec.mutable_compression()->set_fraction(0.05);
  spec.mutable_aggregation()->set_rule("median");
  ExpectRefused(spec, "compression.encoding", "a dense encoding with aggregation rule \"median\"");
}

// `download`: how the model travels to the workers, a dense encoding, beside or without the
// updates' encoding.
TEST(CompressionSpecTest, TheModelsDownloadEncodingIsReadCheckedAndWrittenBack) {
  Result<v1::JobSpec> plain = Parse(Spec("", "[compression]\nencoding = \"int8\"\n"));
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->compression().download(), v1::ENCODING_UNSPECIFIED);
  EXPECT_EQ(wire::JobDownloadEncoding(*plain), UpdateEncoding::kFloat32);
  const std::pair<const char*, UpdateEncoding> cases[] = {
      {"float16", UpdateEncoding::kFloat16}, {"BFloat16", UpdateEncoding::kBFloat16}, {"int8", UpdateEncoding::kInt8}};
  for (const auto& [name, encoding] : cases) {
    SCOPED_TRACE(name);
    Result<v1::JobSpec> spec = Parse(Spec("", std::string("[compression]\ndownload = \"") + name + "\"\n"));
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    EXPECT_EQ(wire::JobDownloadEncoding(*spec), encoding);
    EXPECT_EQ(wire::JobUpdateEncoding(*spec), UpdateEncoding::kFloat32);  // the updates as they were
    const std::string text = JobSpecToToml(*spec);
    EXPECT_NE(text.find("download = "), std::string::npos) << text;
    Result<v1::JobSpec> again = ParseJobSpecString(text, "shown.toml");
    ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << text;
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*spec, *again)) << text;
  }
  Result<v1::JobSpec> both = Parse(Spec("", "[compression]\nencoding = \"topk\"\nfraction = 0.01\ndownload = \"int8\"\n"));
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ(wire::JobUpdateEncoding(*both), UpdateEncoding::kTopK);
  EXPECT_EQ(wire::JobDownloadEncoding(*both), UpdateEncoding::kInt8);

  ExpectError(Spec("", "[compression]\ndownload = \"topk\"\n"),
              {"job.toml:8:", "'compression.download'", "\"float32\", \"float16\", \"bfloat16\", \"int8\"", "found \"topk\""});
  ExpectError(Spec("", "[compression]\ndownlaod = \"int8\"\n"),
              {"unknown key 'compression.downlaod'", "allowed keys in [compression]: encoding, fraction, download"});
  ExpectError(Spec("strategy = \"scaffold\"\n", "[compression]\ndownload = \"float16\"\n"),
              {"spec.compression.download: expected \"float32\" for strategy \"scaffold\""});

  v1::JobSpec spec = WireSpec();
  spec.mutable_compression()->set_download(v1::ENCODING_TOPK);
  ExpectRefused(spec, "compression.download", "a dense encoding of the model");
  spec.mutable_compression()->set_download(static_cast<v1::Encoding>(42));
  ExpectRefused(spec, "compression.download", "got 42");
  spec.mutable_compression()->set_download(v1::ENCODING_BFLOAT16);
  EXPECT_TRUE(wire::ValidateJobSpec(spec).ok());

  // examples/fmnist-download-{float16,int8}.toml: the demo with its model sent compressed.
  const std::string examples = std::string(TESSERA_SOURCE_DIR) + "/examples/";
  Result<v1::JobSpec> demo = ParseJobSpecFile(examples + "fmnist-fedavg.toml");
  ASSERT_TRUE(demo.ok()) << demo.status().ToString();
  for (const auto& [name, encoding] : {std::pair<const char*, v1::Encoding>{"float16", v1::ENCODING_FLOAT16},
                                       {"int8", v1::ENCODING_INT8}}) {
    Result<v1::JobSpec> example = ParseJobSpecFile(examples + "fmnist-download-" + name + ".toml");
    ASSERT_TRUE(example.ok()) << example.status().ToString();
    EXPECT_EQ(example->name(), std::string("fmnist-download-") + name);
    EXPECT_EQ(example->compression().download(), encoding);
    v1::JobSpec rest = *example;
    rest.set_name(demo->name());
    rest.clear_compression();
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(rest, *demo)) << JobSpecToToml(rest);
  }
}

}  // namespace
}  // namespace tessera
