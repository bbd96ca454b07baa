// The coordinator's monitoring port over TLS: the dashboard's files for anyone, /metrics and
// the JSON for operators only (certificate or admin token; a revoked certificate is refused),
// an event stream ends once its certificate is revoked, a client that offers to resume its TLS
// session served with a full handshake, metrics that count what a real job did, and the
// port's per-address limit as --metrics-max-connections-per-address sets it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <httplib.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ctime>
#include <fstream>
#include <map>
#include <regex>

#include "base/flags.h"
#include "base/http_limit_flags.h"
#include "base/metrics.h"
#include "server/monitoring/monitoring.h"
#include "tests/base/raw_http_client.h"
#include "tests/integration/harness.h"

namespace tessera::testing {
namespace {

constexpr char kAdminToken[] = "monitoring-admin-token";

// A value of `series` (the name with its labels, as rendered) in the text format, or -1.
double Value(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

class MonitoringTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto options = TestCoordinatorOptions(dir_.str());
    options.admin_token = kAdminToken;
    // A revocation list that is not there yet, as beside a fresh --tls-dir.
    crl_path_ = dir_.str() + "/crl.pem";
    options.tls.crl_path = crl_path_;
    options.tls.crl_optional = true;
    options.tls.crl_recheck = std::chrono::milliseconds(0);
    auto coordinator = server::Coordinator::Start(options);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
    coordinator_ = std::move(coordinator).value();
    server::MonitoringOptions monitoring;
    monitoring.listen = "127.0.0.1:0";
    monitoring.tls = options.tls;
    auto started = server::MonitoringServer::Start(coordinator_.get(), monitoring);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    monitoring_ = std::move(started).value();
    operator_dir_ = TestPki::Get().WriteOperatorDir((dir_.path() / "pki").string());
    worker_dir_ = TestPki::Get().WriteWorkerDir((dir_.path() / "pki").string(), "m1");
  }
  void TearDown() override {
    if (monitoring_) monitoring_->Stop();
  }

  // A client with the given identity's certificate, or none.
  std::unique_ptr<httplib::SSLClient> Client(const std::string& identity_dir = "") {
    auto client = identity_dir.empty()
                      ? std::make_unique<httplib::SSLClient>("127.0.0.1", monitoring_->port())
                      : std::make_unique<httplib::SSLClient>("127.0.0.1", monitoring_->port(), identity_dir + "/tls.crt",
                                                             identity_dir + "/tls.key");
    client->set_ca_cert_path((operator_dir_ + "/ca.crt").c_str());
    client->enable_server_certificate_verification(true);
    return client;
  }

  TempDir dir_{"monitoring"};
  std::unique_ptr<server::Coordinator> coordinator_;
  std::unique_ptr<server::MonitoringServer> monitoring_;
  std::string operator_dir_;
  std::string worker_dir_;
  std::string crl_path_;
};

TEST_F(MonitoringTest, ThePageIsPublicAndEverythingElseIsForOperators) {
  auto anyone = Client();
  auto page = anyone->Get("/");
  ASSERT_TRUE(page) << httplib::to_string(page.error());
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("<title>Tessera coordinator</title>"), std::string::npos);
  EXPECT_NE(page->get_header_value("Content-Security-Policy").find("frame-ancestors 'none'"), std::string::npos)
      << "another site may frame the dashboard";
  EXPECT_EQ(page->get_header_value("X-Frame-Options"), "DENY");
  auto script = anyone->Get("/vendor/uPlot.iife.min.js");
  ASSERT_TRUE(script);
  EXPECT_EQ(script->status, 200);
  EXPECT_GT(script->body.size(), 10000u) << "uPlot is served from the coordinator itself";

  auto metrics = anyone->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 401);
  EXPECT_EQ(metrics->body,
            "the monitoring port needs an operator credential: a tessera-operator certificate (mutual TLS) or the "
            "admin token (\"Authorization: Bearer TOKEN\")\n");
  EXPECT_EQ(metrics->get_header_value("WWW-Authenticate"), "Bearer");
  auto empty = anyone->Get("/metrics", {{"Authorization", "Bearer"}});
  ASSERT_TRUE(empty);
  EXPECT_EQ(empty->status, 401) << "a scheme with no token is no credential";
  EXPECT_EQ(empty->get_header_value("WWW-Authenticate"), "Bearer");
  auto jobs = anyone->Get("/api/jobs");
  ASSERT_TRUE(jobs);
  EXPECT_EQ(jobs->status, 401);

  auto worker = Client(worker_dir_)->Get("/api/jobs");
  ASSERT_TRUE(worker);
  EXPECT_EQ(worker->status, 403) << "a worker's certificate is not an operator's";

  auto wrong = anyone->Get("/metrics", {{"Authorization", "Bearer not-the-token"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 403);
  EXPECT_EQ(wrong->body, "the monitoring port refused the request: its admin token does not match the coordinator's\n");
  auto token = anyone->Get("/metrics", {{"Authorization", std::string("Bearer ") + kAdminToken}});
  ASSERT_TRUE(token);
  EXPECT_EQ(token->status, 200);
  // The scheme's name is case-insensitive, and more than one space may follow it.
  auto lower = anyone->Get("/metrics", {{"Authorization", std::string("bearer   ") + kAdminToken}});
  ASSERT_TRUE(lower);
  EXPECT_EQ(lower->status, 200) << lower->body;
  auto certificate = Client(operator_dir_)->Get("/metrics");
  ASSERT_TRUE(certificate);
  EXPECT_EQ(certificate->status, 200);
  EXPECT_EQ(certificate->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");

  auto bad = Client(operator_dir_)->Get("/api/job?id=a%0Ab");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(bad->body, "job id 'a\\nb': expected letters, digits, '-' or '_'\n");
}

TEST_F(MonitoringTest, OverTlsAHeadIsBoundedBeforeTheOperatorCheckAndAStalledHandshakeIsDropped) {
  httplib::Headers many;
  for (int i = 0; i < 100; ++i) many.emplace("X-Filler-" + std::to_string(i), "v");
  auto refused = Client()->Get("/metrics", many);
  ASSERT_TRUE(refused) << httplib::to_string(refused.error());
  EXPECT_EQ(refused->status, 431);
  EXPECT_EQ(refused->body, "more than 64 header lines\n");

  // Five bytes of a ClientHello, then nothing: the handshake has the read timeout (5 s), whole.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(monitoring_->port()));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::send(fd, "\x16\x03\x01\x02\x00", 5, MSG_NOSIGNAL), 5);
  pollfd p{fd, POLLIN, 0};
  char byte;
  const bool closed = ::poll(&p, 1, 30'000) == 1 && ::recv(fd, &byte, 1, 0) <= 0;
  ::close(fd);
  EXPECT_TRUE(closed) << "the coordinator closed a handshake that stalled";
  auto after = Client(operator_dir_)->Get("/metrics");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200);
}

// One GET /metrics over a new TLS connection (exactly `version`) with the certificate in `dir`,
// offering `offer` (null: none) to resume. The response's status line, "" when the handshake
// failed; `*reused` says whether the session was resumed, `*next` is the session to offer next.
std::string RequestOnNewConnection(int port, const std::string& dir, int version, SSL_SESSION* offer, bool* reused,
                                   SSL_SESSION** next) {
  std::unique_ptr<SSL_CTX, void (*)(SSL_CTX*)> ctx(SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
  EXPECT_TRUE(ctx && SSL_CTX_set_min_proto_version(ctx.get(), version) == 1 &&
              SSL_CTX_set_max_proto_version(ctx.get(), version) == 1 &&
              SSL_CTX_use_certificate_file(ctx.get(), (dir + "/tls.crt").c_str(), SSL_FILETYPE_PEM) == 1 &&
              SSL_CTX_use_PrivateKey_file(ctx.get(), (dir + "/tls.key").c_str(), SSL_FILETYPE_PEM) == 1 &&
              SSL_CTX_load_verify_locations(ctx.get(), (dir + "/ca.crt").c_str(), nullptr) == 1);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  std::unique_ptr<SSL, void (*)(SSL*)> ssl(SSL_new(ctx.get()), SSL_free);
  SSL_set_fd(ssl.get(), fd);
  if (offer != nullptr) SSL_set_session(ssl.get(), offer);
  std::string response;
  if (SSL_connect(ssl.get()) == 1) {
    *reused = SSL_session_reused(ssl.get()) == 1;
    const std::string request = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    EXPECT_EQ(SSL_write(ssl.get(), request.data(), static_cast<int>(request.size())), static_cast<int>(request.size()));
    char buffer[4096];
    for (int n; (n = SSL_read(ssl.get(), buffer, sizeof(buffer))) > 0;) response.append(buffer, static_cast<size_t>(n));
    *next = SSL_get1_session(ssl.get());  // TLS 1.3 tickets come after the handshake: read them first
    SSL_shutdown(ssl.get());  // a session freed without it is no longer offered
  }
  ERR_clear_error();
  ssl.reset();
  ::close(fd);
  return response.substr(0, response.find("\r\n"));
}

// A client that offers to resume its last session (browsers, most HTTP libraries) is served:
// it gets a full handshake, its certificate verified again (an expired one is not let back in
// on a session from before), never a failed handshake.
TEST_F(MonitoringTest, AClientThatOffersToResumeItsSessionIsVerifiedAgainAndServed) {
  for (const int version : {TLS1_2_VERSION, TLS1_3_VERSION}) {
    SSL_SESSION* session = nullptr;
    bool reused = true;
    EXPECT_EQ(RequestOnNewConnection(monitoring_->port(), operator_dir_, version, nullptr, &reused, &session),
              "HTTP/1.1 200 OK") << version;
    EXPECT_FALSE(reused);
    ASSERT_NE(session, nullptr);
    SSL_SESSION* again = nullptr;
    reused = true;
    EXPECT_EQ(RequestOnNewConnection(monitoring_->port(), operator_dir_, version, session, &reused, &again),
              "HTTP/1.1 200 OK") << version;
    EXPECT_FALSE(reused) << version;
    SSL_SESSION_free(session);
    SSL_SESSION_free(again);
  }
}

TEST_F(MonitoringTest, ARevokedOperatorIsRefusedHereAsOnTheGrpcPort) {
  auto before = Client(operator_dir_)->Get("/metrics");
  ASSERT_TRUE(before);
  EXPECT_EQ(before->status, 200);
  // The list appears after the start, as `tessera provision --revoke` writes it.
  const std::string revoked = TestPki::Get().OperatorTls().cert_pem;
  auto crl = cli::RevokeCertificates(TestPki::Get().ca(), "", {revoked}, static_cast<int64_t>(std::time(nullptr)));
  ASSERT_TRUE(crl.ok()) << crl.status().ToString();
  std::ofstream(crl_path_) << *crl;
  auto after = Client(operator_dir_)->Get("/metrics");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 403);
  EXPECT_NE(after->body.find("the monitoring port refuses the caller's certificate (CN 'test-operator', OU "
                             "'tessera-operator'): it is revoked (serial "),
            std::string::npos)
      << after->body;
  auto jobs = v1::JobService::NewStub(
      *wire::MakeChannel("127.0.0.1:" + std::to_string(coordinator_->port()), TestPki::Get().OperatorTls()));
  grpc::ClientContext ctx;
  v1::ListJobsResponse listed;
  grpc::Status call = jobs->ListJobs(&ctx, v1::ListJobsRequest(), &listed);
  EXPECT_EQ(call.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(call.error_message().find("it is revoked (serial "), std::string::npos) << call.error_message();
  auto token = Client()->Get("/metrics", {{"Authorization", std::string("Bearer ") + kAdminToken}});
  ASSERT_TRUE(token);
  EXPECT_EQ(token->status, 200) << "the admin token is not a certificate";
}

TEST_F(MonitoringTest, AnEventStreamEndsWhenItsCertificateIsRevoked) {
  auto job = coordinator_->SubmitJob(SmallJob(1, 1, 1000));
  ASSERT_TRUE(job.ok());
  auto client = Client(operator_dir_);
  std::string received;
  bool revoked = false;
  int after_revocation = 0;  // pieces read since: one every 250 ms while the stream runs
  // The job waits for workers that never come: its stream would run on. Once the first event
  // is in, the operator's certificate is revoked; the stream must then end with an error.
  auto result = client->Get(("/api/events?job=" + job->id()).c_str(), [&](const char* data, size_t n) {
    received.append(data, n);
    if (!revoked && received.find("\n\n") != std::string::npos) {
      auto crl = cli::RevokeCertificates(TestPki::Get().ca(), "", {TestPki::Get().OperatorTls().cert_pem},
                                         static_cast<int64_t>(std::time(nullptr)));
      EXPECT_TRUE(crl.ok()) << crl.status().ToString();
      std::ofstream(crl_path_) << *crl;
      revoked = true;
    } else if (revoked) {
      ++after_revocation;
    }
    return after_revocation < 40;
  });
  ASSERT_TRUE(result) << "the stream did not end after its certificate was revoked";
  ASSERT_TRUE(revoked);
  EXPECT_NE(received.find("event: error\ndata: the monitoring port refuses the caller's certificate (CN "
                          "'test-operator'"),
            std::string::npos)
      << received.substr(0, 600);
  EXPECT_EQ(received.find("event: end"), std::string::npos) << "the job did not end";
  ASSERT_TRUE(coordinator_->CancelJob(job->id()).ok());
}

TEST_F(MonitoringTest, MetricsCountWhatARealJobDid) {
  const std::string address = "127.0.0.1:" + std::to_string(coordinator_->port());
  std::vector<std::unique_ptr<WorkerThread>> workers;
  for (int i = 1; i <= 2; ++i) workers.push_back(std::make_unique<WorkerThread>(address, "m" + std::to_string(i)));
  auto stub = JobStub(coordinator_->port());
  ASSERT_TRUE(WaitForWorkers(*stub, 2, std::chrono::seconds(20)));
  auto job = coordinator_->SubmitJob(SmallJob(2, 2, 2000));
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  auto done = WaitForJob(*stub, job->id(), std::chrono::seconds(60));
  ASSERT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << done.job().error();

  auto client = Client(operator_dir_);
  auto response = client->Get("/metrics");
  ASSERT_TRUE(response);
  ASSERT_EQ(response->status, 200);
  const std::string& text = response->body;
  const std::string job_label = "job=\"" + job->id() + "\"";
  EXPECT_EQ(Value(text, "tessera_rounds_committed_total{" + job_label + "}"), 2) << text;
  EXPECT_EQ(Value(text, "tessera_updates_total{" + job_label + ",outcome=\"accepted\",reason=\"none\"}"), 4) << text;
  EXPECT_GE(Value(text, "tessera_upload_queue"), 0) << text;
  EXPECT_EQ(Value(text, "tessera_round_phase_seconds_count{" + job_label + ",phase=\"total\"}"), 2) << text;
  EXPECT_EQ(Value(text, "tessera_round_phase_seconds_bucket{" + job_label + ",phase=\"total\",le=\"+Inf\"}"), 2);
  EXPECT_GT(Value(text, "tessera_round_phase_seconds_sum{" + job_label + ",phase=\"compute\"}"), 0) << text;
  EXPECT_EQ(Value(text, "tessera_rounds_retried_total{" + job_label + "}"), 0) << text;
  EXPECT_EQ(Value(text, "tessera_worker_compute_seconds_count{worker=\"m1\"}"), 2) << text;
  EXPECT_GT(Value(text, "tessera_worker_download_bytes_total{worker=\"m1\"}"), 0) << text;
  EXPECT_GT(Value(text, "tessera_worker_upload_bytes_total{worker=\"m2\"}"), 0) << text;
  // The committed rounds' bytes on the wire, as their records give them.
  double uploaded = 0, downloaded = 0;
  for (const auto& r : done.rounds()) {
    uploaded += static_cast<double>(r.upload_bytes());
    downloaded += static_cast<double>(r.download_bytes());
  }
  EXPECT_GT(uploaded, 0);
  EXPECT_EQ(Value(text, "tessera_round_bytes_total{" + job_label + ",direction=\"upload\"}"), uploaded) << text;
  EXPECT_EQ(Value(text, "tessera_round_bytes_total{" + job_label + ",direction=\"download\"}"), downloaded) << text;
  EXPECT_EQ(Value(text, "tessera_workers{state=\"alive\"}"), 2) << text;
  EXPECT_GE(Value(text, "tessera_jobs{state=\"succeeded\"}"), 1) << text;
  const double share = Value(text, "tessera_round_communication_ratio{" + job_label + "}");
  EXPECT_GE(share, 0);
  EXPECT_LE(share, 1);
  EXPECT_GE(Value(text, "tessera_open_streams"), 2) << "each worker's task channel";
  // Worker-side families, from the in-process workers.
  EXPECT_GE(Value(text, "tessera_rounds_trained_total"), 4) << text;
  EXPECT_GE(Value(text, "tessera_local_train_seconds_count"), 4) << text;
  EXPECT_NE(text.find("tessera_device_pool_bytes{device=\"cpu\",kind=\"in_use\"}"), std::string::npos) << text;
  // No series is labelled by round.
  EXPECT_FALSE(std::regex_search(text, std::regex("round=\""))) << text;

  auto api = client->Get(("/api/job?id=" + job->id()).c_str());
  ASSERT_TRUE(api);
  ASSERT_EQ(api->status, 200);
  EXPECT_NE(api->body.find("\"rounds\":[{"), std::string::npos) << api->body.substr(0, 400);
  EXPECT_NE(api->body.find("\"worker_id\":\"m1\""), std::string::npos);
  EXPECT_NE(api->body.find("\"next_round\":0"), std::string::npos) << "two small rounds fit one page";
  // The page asks only for the rounds it does not have yet.
  auto later = client->Get(("/api/job?id=" + job->id() + "&from=2").c_str());
  ASSERT_TRUE(later);
  ASSERT_EQ(later->status, 200);
  EXPECT_NE(later->body.find("\"rounds\":[{"), std::string::npos);
  EXPECT_EQ(later->body.find("\"round\":1,"), std::string::npos) << "round 1 was not asked for";
  auto none = client->Get(("/api/job?id=" + job->id() + "&from=3").c_str());
  ASSERT_TRUE(none);
  EXPECT_NE(none->body.find("\"rounds\":[]"), std::string::npos) << none->body.substr(0, 200);
  auto bad_from = client->Get(("/api/job?id=" + job->id() + "&from=4294967296").c_str());
  ASSERT_TRUE(bad_from);
  EXPECT_EQ(bad_from->status, 400);
  EXPECT_EQ(bad_from->body, "from '4294967296': expected a round number, 0 to 4294967295\n");
  // A parameter /api/job does not take is named, not ignored.
  auto misspelt = client->Get(("/api/job?id=" + job->id() + "&form=2").c_str());
  ASSERT_TRUE(misspelt);
  EXPECT_EQ(misspelt->status, 400);
  EXPECT_EQ(misspelt->body, "parameter 'form': /api/job takes id and from\n");
  auto extra = client->Get(("/api/job?id=" + job->id() + "&from=1&reports=all").c_str());
  ASSERT_TRUE(extra);
  EXPECT_EQ(extra->status, 400);
  EXPECT_EQ(extra->body, "parameter 'reports': /api/job takes id and from\n");
  // Every reply says which of its rounds' reports it left out: none here.
  EXPECT_NE(api->body.find("\"reports_left_out\":[]"), std::string::npos) << api->body.substr(api->body.size() - 200);
  auto listed = client->Get("/api/workers");
  ASSERT_TRUE(listed);
  EXPECT_NE(listed->body.find("\"worker_id\":\"m2\""), std::string::npos) << listed->body.substr(0, 400);
}

// The dashboard asks for /api/workers every 2 s: a federation of many workers, each with up to
// 8 KiB of device properties, is listed as `tessera workers` lists it, 1,000 at most, the rest
// counted.
TEST_F(MonitoringTest, TheWorkersListIsBoundedAndCountsTheOthers) {
  std::vector<v1::WorkerStatus> known;
  for (int i = 0; i < 1003; ++i) {
    v1::WorkerStatus w;
    w.set_worker_id("site-" + std::to_string(10000 + i));
    w.set_state("idle");
    w.mutable_device()->set_name("cpu");
    known.push_back(std::move(w));
  }
  coordinator_->registry().Restore(known);
  auto listed = Client(operator_dir_)->Get("/api/workers");
  ASSERT_TRUE(listed);
  ASSERT_EQ(listed->status, 200);
  google::protobuf::Struct reply;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(listed->body, &reply).ok()) << listed->body.substr(0, 300);
  EXPECT_EQ(reply.fields().at("workers").list_value().values_size(), 1000);
  EXPECT_EQ(reply.fields().at("more").string_value(), "3") << "a uint64 is a string in JSON";
}

// The dashboard labels an emulated device from the `emulated` field of /api/workers, not from
// its name's text, which a long name may have lost.
TEST_F(MonitoringTest, TheWorkersListSaysWhichDevicesAreEmulated) {
  std::vector<v1::WorkerStatus> known(2);
  known[0].set_worker_id("site-emulated");
  known[0].mutable_device()->set_name("emu:/" + std::string(123, 'p'));
  known[0].mutable_device()->set_emulated(true);
  known[1].set_worker_id("site-cpu");
  known[1].mutable_device()->set_name("cpu");
  coordinator_->registry().Restore(known);
  auto listed = Client(operator_dir_)->Get("/api/workers");
  ASSERT_TRUE(listed);
  ASSERT_EQ(listed->status, 200);
  google::protobuf::Struct reply;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(listed->body, &reply).ok()) << listed->body.substr(0, 300);
  std::map<std::string, bool> emulated;
  for (const auto& w : reply.fields().at("workers").list_value().values()) {
    const auto& fields = w.struct_value().fields();
    emulated[fields.at("worker_id").string_value()] =
        fields.at("device").struct_value().fields().at("emulated").bool_value();
  }
  EXPECT_EQ(emulated, (std::map<std::string, bool>{{"site-cpu", false}, {"site-emulated", true}})) << listed->body;
}

TEST_F(MonitoringTest, EventsFollowAJobUntilItsStateSettles) {
  auto job = coordinator_->SubmitJob(SmallJob(1, 1, 1000));
  ASSERT_TRUE(job.ok());
  auto client = Client(operator_dir_);
  std::string received;
  // The first event is the job as it is now; the client stops reading after it.
  client->Get(("/api/events?job=" + job->id()).c_str(), [&](const char* data, size_t n) {
    received.append(data, n);
    return received.find("\n\n") == std::string::npos;
  });
  EXPECT_EQ(received.rfind("event: job\ndata: {", 0), 0u) << received;
  EXPECT_NE(received.find("\"id\":\"" + job->id() + "\""), std::string::npos) << received;
  ASSERT_TRUE(coordinator_->CancelJob(job->id()).ok());
  // An ended job's stream says so and ends: it holds none of the endpoint's threads.
  std::string ended;
  auto result = client->Get(("/api/events?job=" + job->id()).c_str(), [&](const char* data, size_t n) {
    ended.append(data, n);
    return true;  // read on: the server ends the stream
  });
  ASSERT_TRUE(result) << "the stream of an ended job did not end";
  EXPECT_NE(ended.find("\"state\":\"JOB_CANCELLED\""), std::string::npos) << ended.substr(0, 300);
  EXPECT_NE(ended.find("event: end\n"), std::string::npos) << ended.substr(0, 300);
}

// The coordinator's port with --metrics-max-connections-per-address=1, read as tessera-coordinator
// reads it: while one connection from 127.0.0.1 is open, a second from it is closed unserved
// (and counted), and the first is still answered.
TEST_F(MonitoringTest, APerAddressLimitOfOneFromItsFlagHoldsASecondConnectionOff) {
  FlagSet flags;
  std::string listen;
  HttpLimitFlags limits;
  flags.String("metrics-listen", &listen, "");
  DeclareHttpLimitFlags(flags, "metrics", &limits);
  std::vector<std::string> args = {"tessera-coordinator", "--metrics-listen=127.0.0.1:0",
                                   "--metrics-max-connections-per-address=1"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  ASSERT_TRUE(flags.ParseFlagsOnly(static_cast<int>(argv.size()), argv.data()).ok());
  ASSERT_TRUE(CheckHttpLimitFlags(flags, "metrics", limits).ok());
  server::MonitoringOptions options;
  options.listen = listen;
  options.tls.insecure = true;  // on loopback: raw connections, no handshake to hold them open
  options.max_connections = static_cast<int>(limits.max_connections);
  options.max_connections_per_address = static_cast<int>(limits.max_connections_per_address);
  auto started = server::MonitoringServer::Start(coordinator_.get(), options);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  auto& dropped = metrics::Global().Counter("tessera_http_connections_dropped_total", "", {"reason"}).With({"per_address"});
  const double dropped_before = dropped.value();

  RawClient first((*started)->port(), 0, "127.0.0.1");
  ASSERT_TRUE(first.connected());
  RawClient second((*started)->port(), 0, "127.0.0.1");
  ASSERT_TRUE(second.connected());  // the kernel accepts it into the backlog; the endpoint closes it
  second.Send("GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
  bool closed = false;
  EXPECT_EQ(second.ReadUntilClosed(std::chrono::seconds(60), &closed), "") << "closed without an answer";
  EXPECT_TRUE(closed);
  // Counted just after the close: looked at every 10 ms for up to 30 s.
  for (int i = 0; i < 3000 && dropped.value() < dropped_before + 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(dropped.value(), dropped_before + 1) << "not closed for its address's limit";
  // The first is answered (401: /metrics is for operators).
  ASSERT_TRUE(first.Send("GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n"));
  const std::string answer = first.ReadUntilClosed(std::chrono::seconds(60));
  EXPECT_EQ(answer.rfind("HTTP/1.1 401 Unauthorized\r\n", 0), 0u) << answer;
  (*started)->Stop();
}

}  // namespace
}  // namespace tessera::testing
