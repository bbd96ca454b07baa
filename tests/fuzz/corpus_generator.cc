// Writes the fuzzers' seed corpora: a handful of valid and nearly valid inputs per target,
// made with the encoders the decoders are meant to read (BuildManifest, ForEachChunk,
// AppendUpdateSet, EncodeCheckpoint, JobSpecToToml, WriteMaybeGzipFile, RevokeCertificates), so that they follow
// the formats as they change. The output is committed under tests/fuzz/corpus/<target>/.
//
//   fuzz_corpus_generator SOURCE_DIR OUT_DIR
// SOURCE_DIR is the repository (its examples/*.toml seed the job spec targets).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "base/sha256.h"
#include "base/xxh3.h"
#include "cli/job_spec.h"
#include "cli/provision.h"
#include "core/data/dataset_source.h"
#include "core/data/idx.h"
#include "core/data/numpy_format.h"
#include "core/update_codec.h"
#include "fuzz_records.h"
#include "proto/tensor_transfer.h"
#include "proto/transport_security.h"
#include "proto/update_envelope.h"
#include "server/state/state_store.h"

namespace tessera::fuzz {
namespace {

namespace fs = std::filesystem;

void WriteFile(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::cerr << "cannot write " << path << "\n";
    std::exit(1);
  }
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A small model: a weight matrix, a bias and an empty tensor, values that are not all alike.
TensorSet SmallModel() {
  TensorSet tensors(3);
  tensors[0].name = "fc1.weight";
  tensors[0].shape = {4, 3};
  tensors[1].name = "fc1.bias";
  tensors[1].shape = {4};
  tensors[2].name = "empty";
  tensors[2].shape = {0, 5};
  for (auto& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    t.values.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) t.values[static_cast<size_t>(i)] = 0.25f * static_cast<float>(i) - 1.0f;
  }
  return tensors;
}

std::vector<std::string> Chunks(const TensorSet& tensors, uint32_t chunk_bytes) {
  std::vector<std::string> chunks;
  (void)wire::ForEachChunk(tensors, chunk_bytes, 0, [&](const v1::TensorChunk& chunk) {
    chunks.push_back(chunk.SerializeAsString());
    return Status::Ok();
  });
  return chunks;
}

std::vector<std::string> EncodedChunks(const wire::UpdateBytes& tensors, uint32_t chunk_bytes) {
  std::vector<std::string> chunks;
  (void)wire::ForEachChunk(tensors, chunk_bytes, [&](const v1::TensorChunk& chunk) {
    chunks.push_back(chunk.SerializeAsString());
    return Status::Ok();
  });
  return chunks;
}

std::string Transfer(const std::string& header, const std::vector<std::string>& chunks) {
  std::string out = Record(header);
  for (const auto& chunk : chunks) out += Record(chunk);
  return out;
}

void TensorTransferCorpus(const fs::path& dir) {
  const TensorSet model = SmallModel();
  const v1::TensorManifest manifest = wire::BuildManifest(model, 16);
  const std::vector<std::string> chunks = Chunks(model, 16);
  WriteFile(dir / "valid_three_tensors", Transfer(manifest.SerializeAsString(), chunks));
  WriteFile(dir / "valid_one_chunk_each", Transfer(wire::BuildManifest(model).SerializeAsString(), Chunks(model, 1 << 20)));
  WriteFile(dir / "valid_no_tensors", Transfer(wire::BuildManifest({}).SerializeAsString(), {}));

  std::vector<std::string> cut(chunks.begin(), chunks.end() - 1);
  WriteFile(dir / "ends_early", Transfer(manifest.SerializeAsString(), cut));
  std::vector<std::string> swapped = chunks;
  std::swap(swapped[0], swapped[1]);
  WriteFile(dir / "chunks_out_of_order", Transfer(manifest.SerializeAsString(), swapped));
  v1::TensorManifest bad_hash = manifest;
  bad_hash.mutable_tensors(0)->mutable_sha256()->front() ^= 1;
  WriteFile(dir / "wrong_hash", Transfer(bad_hash.SerializeAsString(), chunks));
  v1::TensorManifest bad_size = manifest;
  bad_size.mutable_tensors(1)->set_byte_size(20);
  bad_size.set_total_bytes(manifest.total_bytes() + 4);
  WriteFile(dir / "size_disagrees_with_shape", Transfer(bad_size.SerializeAsString(), chunks));
  v1::TensorManifest negative = manifest;
  negative.mutable_tensors(0)->set_shape(0, -4);
  WriteFile(dir / "negative_dimension", Transfer(negative.SerializeAsString(), chunks));

  // A model version sent compressed: each tensor in float16 or int8, checked by XXH3-128 of
  // its bytes as sent.
  for (UpdateEncoding encoding : {UpdateEncoding::kFloat16, UpdateEncoding::kInt8}) {
    v1::TensorManifest sent;
    sent.set_chunk_bytes(16);
    std::vector<std::string> bytes;
    for (const NamedTensor& t : model) {
      bytes.push_back(EncodeValues(encoding, t.values, 0));
      v1::TensorInfo* info = sent.add_tensors();
      info->set_name(t.name);
      for (int64_t d : t.shape) info->add_shape(d);
      info->set_dtype(encoding == UpdateEncoding::kInt8 ? v1::DTYPE_INT8 : v1::DTYPE_FLOAT16);
      info->set_byte_size(bytes.back().size());
      info->set_xxh3_128(Xxh3Hex(bytes.back().data(), bytes.back().size()));
      sent.set_total_bytes(sent.total_bytes() + bytes.back().size());
    }
    const std::vector<std::string_view> views(bytes.begin(), bytes.end());
    std::vector<std::string> sent_chunks;
    (void)wire::ForEachChunk(std::span<const std::string_view>(views), 16, 0, [&](const v1::TensorChunk& chunk) {
      sent_chunks.push_back(chunk.SerializeAsString());
      return Status::Ok();
    });
    WriteFile(dir / (std::string("valid_encoded_") + UpdateEncodingName(encoding)), Transfer(sent.SerializeAsString(), sent_chunks));
  }
}

void UpdateEnvelopeCorpus(const fs::path& dir) {
  const TensorSet delta = SmallModel();
  TensorSet momentum = SmallModel();
  momentum.resize(2);
  v1::UpdateHeader legacy;
  legacy.set_worker_id("w-1");
  legacy.set_job_id("j-1");
  legacy.set_round(2);
  *legacy.mutable_manifest() = wire::BuildManifest(delta, 32);
  WriteFile(dir / "valid_manifest_only", Transfer(legacy.SerializeAsString(), Chunks(delta, 32)));

  v1::UpdateHeader sets = legacy;
  sets.clear_manifest();
  auto* d = sets.add_sets();
  d->set_name(wire::kDeltaSet);
  d->set_encoding(v1::ENCODING_FLOAT32);
  *d->mutable_manifest() = wire::BuildManifest(delta, 32);
  auto* m = sets.add_sets();
  m->set_name("momentum");
  *m->mutable_manifest() = wire::BuildManifest(momentum, 32);
  TensorSet both = delta;
  both.insert(both.end(), momentum.begin(), momentum.end());
  WriteFile(dir / "valid_two_sets", Transfer(sets.SerializeAsString(), Chunks(both, 32)));

  v1::UpdateHeader no_delta = sets;
  no_delta.mutable_sets(0)->set_name("other");
  WriteFile(dir / "no_delta_set", Transfer(no_delta.SerializeAsString(), Chunks(both, 32)));
  v1::UpdateHeader twice = sets;
  twice.mutable_sets(1)->set_name(wire::kDeltaSet);
  WriteFile(dir / "set_named_twice", Transfer(twice.SerializeAsString(), Chunks(both, 32)));
  v1::UpdateHeader mixed = sets;
  *mixed.mutable_manifest() = wire::BuildManifest(delta, 32);
  WriteFile(dir / "manifest_and_sets", Transfer(mixed.SerializeAsString(), Chunks(both, 32)));

  // Each encoding (the fuzzer reads top-k at a fraction of 0.25), and top-k pairs that the
  // decoder must refuse under a hash that matches them.
  for (const auto& [name, encoding] : {std::pair<const char*, UpdateEncoding>{"float16", UpdateEncoding::kFloat16},
                                       {"bfloat16", UpdateEncoding::kBFloat16},
                                       {"int8", UpdateEncoding::kInt8},
                                       {"topk", UpdateEncoding::kTopK}}) {
    v1::UpdateHeader encoded = legacy;
    encoded.clear_manifest();
    wire::UpdateBytes bytes;
    wire::AppendUpdateSet(wire::kDeltaSet, delta, encoding, 0.25, 8, &encoded, &bytes);
    WriteFile(dir / (std::string("valid_") + name), Transfer(encoded.SerializeAsString(), EncodedChunks(bytes, 8)));
    if (encoding != UpdateEncoding::kTopK) continue;
    std::string& pairs = bytes[0];  // fc1.weight: 3 pairs
    std::swap_ranges(pairs.begin(), pairs.begin() + 4, pairs.begin() + 8);  // indices out of order
    encoded.mutable_sets(0)->mutable_manifest()->mutable_tensors(0)->set_sha256(Sha256Hex(pairs.data(), pairs.size()));
    WriteFile(dir / "topk_indices_out_of_order", Transfer(encoded.SerializeAsString(), EncodedChunks(bytes, 8)));
  }
}

void CheckpointCorpus(const fs::path& dir) {
  const std::string valid = server::EncodeCheckpoint(SmallModel());
  WriteFile(dir / "valid_small_model", valid);
  WriteFile(dir / "valid_empty", server::EncodeCheckpoint({}));
  WriteFile(dir / "truncated", valid.substr(0, valid.size() - 3));
  WriteFile(dir / "trailing_bytes", valid + "xyz");
  std::string flipped = valid;
  flipped[flipped.size() - 5] ^= 0x40;
  WriteFile(dir / "flipped_value", flipped);
  std::string long_manifest = valid;
  long_manifest[8] = static_cast<char>(0xff);
  WriteFile(dir / "manifest_length_too_long", long_manifest);
  WriteFile(dir / "wrong_magic", "TSRCKPT0" + valid.substr(8));
}

std::vector<uint8_t> IdxFile(uint32_t magic, const std::vector<uint32_t>& dims, size_t elements) {
  std::vector<uint8_t> out;
  auto be32 = [&](uint32_t v) {
    for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<uint8_t>(v >> shift));
  };
  be32(magic);
  for (uint32_t d : dims) be32(d);
  for (size_t i = 0; i < elements; ++i) out.push_back(static_cast<uint8_t>(i * 37 % 256));
  return out;
}

std::string AsString(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }

std::string Gzipped(const fs::path& scratch, const std::vector<uint8_t>& bytes) {
  const fs::path path = scratch / "idx.gz";
  if (!WriteMaybeGzipFile(path.string(), bytes).ok()) {
    std::cerr << "cannot write " << path << "\n";
    std::exit(1);
  }
  std::string out = ReadFile(path);
  fs::remove(path);
  return out;
}

void IdxCorpus(const fs::path& dir, const fs::path& scratch) {
  const auto images = IdxFile(0x00000803, {3, 4, 5}, 60);
  const auto labels = IdxFile(0x00000801, {6}, 6);
  WriteFile(dir / "valid_images", AsString(images));
  WriteFile(dir / "valid_labels", AsString(labels));
  WriteFile(dir / "valid_images.gz", Gzipped(scratch, images));
  WriteFile(dir / "valid_labels.gz", Gzipped(scratch, labels));
  WriteFile(dir / "no_images", AsString(IdxFile(0x00000803, {0, 28, 28}, 0)));
  WriteFile(dir / "images_truncated", AsString(IdxFile(0x00000803, {3, 4, 5}, 59)));
  WriteFile(dir / "labels_trailing_data", AsString(IdxFile(0x00000801, {6}, 7)));
  WriteFile(dir / "zero_rows", AsString(IdxFile(0x00000803, {3, 0, 5}, 0)));
  WriteFile(dir / "huge_dimensions", AsString(IdxFile(0x00000803, {0xffffffff, 0xffff, 0xffff}, 4)));
  std::string gz = Gzipped(scratch, images);
  WriteFile(dir / "gzip_truncated", gz.substr(0, gz.size() / 2));
}

void JobSpecCorpora(const fs::path& source_dir, const fs::path& toml_dir, const fs::path& proto_dir) {
  std::vector<fs::path> examples;
  for (const auto& entry : fs::directory_iterator(source_dir / "examples")) {
    if (entry.path().extension() == ".toml") examples.push_back(entry.path());
  }
  std::sort(examples.begin(), examples.end());
  for (const auto& path : examples) {
    const std::string text = ReadFile(path);
    const std::string name = path.stem().string();
    WriteFile(toml_dir / (name + ".toml"), text);
    Result<v1::JobSpec> spec = ParseJobSpecString(text, path.string());
    if (!spec.ok()) {
      std::cerr << spec.status().ToString() << "\n";
      std::exit(1);
    }
    WriteFile(toml_dir / (name + ".written.toml"), JobSpecToToml(*spec));
    WriteFile(proto_dir / (name + ".pb"), spec->SerializeAsString());
  }
  WriteFile(toml_dir / "unknown_key.toml", "name = \"x\"\nrounds = 2\nround = 3\n[data.partition]\nparties = 2\n");
  WriteFile(toml_dir / "wrong_type.toml", "rounds = \"two\"\n[model]\nname = \"mlp\"\n[data.partition]\nparties = 2\n");
  WriteFile(toml_dir / "out_of_range.toml",
            "rounds = 5\nclients_per_round = 9\n[model]\nname = \"mlp\"\nhidden = [-1]\n[data.partition]\n"
            "kind = \"dirichlet\"\nbeta = -0.5\nparties = 3\n[train]\nlearning_rate = inf\n");
  WriteFile(toml_dir / "local_files.toml",
            "name = \"sites\"\nrounds = 1\n[model]\nname = \"simplecnn\"\n[data]\npath = \"/srv/data\"\n"
            "[data.partition]\nkind = \"local-files\"\nparties = 2\n[train]\nbatch_size = 8\n");

  v1::JobSpec base;
  if (!ParseJobSpecString(ReadFile(examples.front()), "base").ok()) std::exit(1);
  base = *ParseJobSpecString(ReadFile(examples.front()), "base");
  v1::JobSpec zero_rounds = base;
  zero_rounds.set_rounds(0);
  WriteFile(proto_dir / "zero_rounds.pb", zero_rounds.SerializeAsString());
  v1::JobSpec quoted = base;
  quoted.set_name("a \"quoted\" \\ name \xc3\xa9");
  quoted.mutable_data()->set_path("/data/with \"quotes\"");
  WriteFile(proto_dir / "quoted_strings.pb", quoted.SerializeAsString());
  v1::JobSpec local = base;
  local.mutable_data()->mutable_partition()->set_kind(v1::PARTITION_LOCAL_FILES);
  local.mutable_data()->mutable_partition()->set_parties(0);
  WriteFile(proto_dir / "local_files.pb", local.SerializeAsString());
  v1::JobSpec fedavgm = base;
  fedavgm.set_strategy("fedavgm");
  fedavgm.mutable_server()->set_learning_rate(1.0);
  fedavgm.mutable_server()->set_momentum(0.9);
  WriteFile(proto_dir / "fedavgm.pb", fedavgm.SerializeAsString());
}

}  // namespace
}  // namespace tessera::fuzz

namespace tessera::fuzz {

// dataset_fuzzer's inputs: a format byte (0 cifar10, 1 npz, 2 csv), then the test split's file.
void DatasetCorpus(const fs::path& dir, const fs::path& scratch) {
  auto seed = [&](const std::string& name, char format, const fs::path& written) {
    WriteFile(dir / name, std::string(1, format) + ReadFile(written));
    fs::remove(written);
  };
  std::vector<uint8_t> labels = {3, 7}, pixels(2 * 3072);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 13 % 256);
  const fs::path cifar = scratch / "test_batch.bin";
  if (!WriteCifar10Batch(cifar.string(), labels, pixels).ok()) std::exit(1);
  seed("cifar10_two_records", 0, cifar);
  WriteFile(dir / "cifar10_cut_record", std::string(1, 0) + std::string(3000, '\x01'));

  auto array = [](std::string name, std::string dtype, std::vector<int64_t> shape, std::string bytes) {
    NumpyArray a;
    a.name = std::move(name);
    a.dtype = std::move(dtype);
    a.shape = std::move(shape);
    a.data = std::move(bytes);
    return a;
  };
  const fs::path npz = scratch / "test.npz";
  std::string x(2 * 1 * 2 * 2, '\0');
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<char>(i * 30);
  std::string y = {'\1', '\0', '\0', '\0', '\0', '\0', '\0', '\0', '\2', '\0', '\0', '\0', '\0', '\0', '\0', '\0'};
  if (!WriteNpz(npz.string(), {array("x", "|u1", {2, 1, 2, 2}, x), array("y", "<i8", {2}, y)}).ok()) std::exit(1);
  seed("npz_uint8_images", 1, npz);
  const float features[] = {0.5f, -1.25f, 3.0f, 2.0f, 0.0f, 1.0f};
  std::string f(reinterpret_cast<const char*>(features), sizeof(features));
  if (!WriteNpz(npz.string(), {array("x", "<f4", {2, 3}, f), array("y", "<i8", {2}, y)}).ok()) std::exit(1);
  seed("npz_float_features", 1, npz);

  const fs::path csv = scratch / "test.csv";
  if (!WriteCsv(csv.string(), {"label", "a", "b"}, {{0, 1.5, -2}, {1, 0.25, 4}, {2, 3, 3}}).ok()) std::exit(1);
  seed("csv_three_rows", 2, csv);
  WriteFile(dir / "csv_ragged", std::string(1, 2) + "label,a,b\n0,1\n1,2,3,4\n");
  WriteFile(dir / "csv_not_a_number", std::string(1, 2) + "label,a\n0,nan\n1,1e999\n");
}

// Two records: a CA's certificate and a revocation list; the CA is made anew each time.
void RevocationCorpus(const fs::path& dir) {
  auto ca = cli::CreateCertificateAuthority("Fuzz CA", 0, 4102444800);
  auto other = cli::CreateCertificateAuthority("Another CA", 0, 4102444800);
  auto a = ca.ok() ? cli::IssueCertificate(*ca, {"a", wire::kWorkerRole, {}, false, 0, 4102444800})
                   : Result<cli::IssuedCertificate>(ca.status());
  auto b = ca.ok() ? cli::IssueCertificate(*ca, {"b", wire::kOperatorRole, {}, false, 0, 4102444800})
                   : Result<cli::IssuedCertificate>(ca.status());
  if (!ca.ok() || !other.ok() || !a.ok() || !b.ok()) std::exit(1);
  auto one = cli::RevokeCertificates(*ca, "", {a->cert_pem}, 1700000000);
  auto two = one.ok() ? cli::RevokeCertificates(*ca, *one, {b->cert_pem}, 1700000100) : one;
  auto none = cli::RevokeCertificates(*ca, "", {}, 1700000000);
  auto foreign = cli::RevokeCertificates(*other, "", {a->cert_pem}, 1700000000);
  if (!one.ok() || !two.ok() || !none.ok() || !foreign.ok()) std::exit(1);
  WriteFile(dir / "one_revoked", Record(ca->cert_pem) + Record(*one));
  WriteFile(dir / "two_revoked", Record(ca->cert_pem) + Record(*two));
  WriteFile(dir / "empty_list", Record(ca->cert_pem) + Record(*none));
  WriteFile(dir / "another_cas_list", Record(ca->cert_pem) + Record(*foreign));
  WriteFile(dir / "list_truncated", Record(ca->cert_pem) + Record(two->substr(0, two->size() / 2)));
  WriteFile(dir / "certificate_as_list", Record(ca->cert_pem) + Record(a->cert_pem));
}

// Request heads as a browser, curl and Prometheus send them, and a few refused ones; the first
// byte is the fuzzer's piece size.
void HttpHeadCorpus(const fs::path& dir) {
  const std::pair<const char*, std::string> heads[] = {
      {"browser", "GET /api/job?id=job-1&from=3 HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nConnection: keep-alive\r\n"
                  "Accept: text/event-stream\r\nUser-Agent: Mozilla/5.0\r\n\r\n"},
      {"prometheus", "GET /metrics HTTP/1.1\r\nHost: c:9464\r\nAuthorization: Bearer abc\r\nAccept-Encoding: gzip\r\n\r\n"},
      {"pipelined", "GET /a HTTP/1.1\r\n\r\nHEAD /b%20c?x=%41+b HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET"},
      {"bare_line_feeds", "\nGET / HTTP/1.1\nX: y\n\n"},
      {"body", "POST /metrics HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\nbody"},
      {"folded", "GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n"},
      {"many_headers", "GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\nE: 5\r\nF: 6\r\nG: 7\r\nH: 8\r\nI: 9\r\n\r\n"},
      {"version", "GET / HTTP/2.0\r\n\r\n"},
  };
  for (const auto& [name, head] : heads) {
    WriteFile(dir / name, std::string(1, '\x07') + head);
    WriteFile(dir / (std::string(name) + "_bytewise"), std::string(1, '\x00') + head);
  }
}

}  // namespace tessera::fuzz

int main(int argc, char** argv) {
  using namespace tessera::fuzz;
  if (argc != 3) {
    std::cerr << "usage: " << argv[0] << " SOURCE_DIR OUT_DIR\n";
    return 2;
  }
  const fs::path source_dir = argv[1];
  const fs::path out = argv[2];
  TensorTransferCorpus(out / "tensor_transfer_fuzzer");
  UpdateEnvelopeCorpus(out / "update_envelope_fuzzer");
  CheckpointCorpus(out / "checkpoint_fuzzer");
  IdxCorpus(out / "idx_fuzzer", out);
  RevocationCorpus(out / "revocation_list_fuzzer");
  HttpHeadCorpus(out / "http_head_fuzzer");
  DatasetCorpus(out / "dataset_fuzzer", out);
  JobSpecCorpora(source_dir, out / "job_spec_toml_fuzzer", out / "job_spec_proto_fuzzer");
  std::cout << "wrote the seed corpora under " << out << "\n";
  return 0;
}
