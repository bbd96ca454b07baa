// The coordinator's credentials, as the people who hold them meet them: a worker whose
// certificate comes from another CA, has expired, or is missing is refused with a message that
// says which; a worker that does not trust the coordinator's certificate logs what to check; a certificate is one worker's name and no other's; the job service is for
// operators; a name joined with one site's token cannot be taken with another's, even after a
// restart, until an operator forgets the worker; a revoked certificate is refused, also on a connection admitted before; plaintext
// is refused off loopback.
#include <gtest/gtest.h>

#include <ctime>
#include <sstream>
#include <thread>
#include <fstream>
#include <sys/stat.h>

#include "base/clock.h"
#include "cli/job_client.h"
#include "tests/captured_log.h"
#include "tests/integration/harness.h"
#include "tessera/v1/worker_service.grpc.pb.h"

namespace tessera::testing {
namespace {

int64_t Now() { return static_cast<int64_t>(std::time(nullptr)); }

// A worker agent on its own thread over `tls`, until it stops.
struct AgentRun {
  AgentRun(const std::string& address, const std::string& name, const wire::ClientTls& tls,
           const std::string& token = kToken) {
    worker::WorkerOptions options;
    options.name = name;
    options.join_token = token;
    options.backoff_initial_ms = 100;
    options.backoff_max_ms = 500;
    agent = std::make_unique<worker::WorkerAgent>(options, std::move(worker::MakeGrpcCoordinatorClient(address, tls)).value());
    thread = std::thread([this] { result = agent->Run(); });
  }
  ~AgentRun() {
    agent->Stop();
    if (thread.joinable()) thread.join();
  }
  // The result of Run(), once it has returned by itself (a fatal error).
  Status Finish() {
    thread.join();
    return result;
  }
  std::unique_ptr<worker::WorkerAgent> agent;
  std::thread thread;
  Status result;
};

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto started = server::Coordinator::Start(TestCoordinatorOptions(dir_.str()));
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    coordinator_ = std::move(started).value();
    address_ = "127.0.0.1:" + std::to_string(coordinator_->port());
  }

  // A client that trusts the coordinator and shows `issued`.
  static wire::ClientTls Showing(const cli::IssuedCertificate& issued) {
    wire::ClientTls tls;
    tls.ca_pem = TestPki::Get().ca().cert_pem;
    tls.cert_pem = issued.cert_pem;
    tls.key_pem = issued.key_pem;
    return tls;
  }

  std::string Refusal(const std::string& cn, const std::string& why) {
    return "join " + address_ + ": this coordinator uses mutual TLS and refuses the caller's certificate (CN '" + cn +
           "', OU 'tessera-worker'): " + why;
  }

  TempDir dir_{"security"};
  std::unique_ptr<server::Coordinator> coordinator_;
  std::string address_;
};

TEST_F(SecurityTest, AWorkerWithACertificateFromAnotherCaIsRefused) {
  auto other_ca = cli::CreateCertificateAuthority("Another CA", Now() - 60, Now() + 3600);
  ASSERT_TRUE(other_ca.ok());
  auto outsider = cli::IssueCertificate(*other_ca, {"outsider", wire::kWorkerRole, {}, false, Now() - 60, Now() + 3600});
  ASSERT_TRUE(outsider.ok());
  AgentRun run(address_, "outsider", Showing(*outsider));
  Status s = run.Finish();
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  EXPECT_EQ(s.message(), Refusal("outsider", "it is not issued by this coordinator's client CA"));
  EXPECT_TRUE(coordinator_->registry().List().empty());
}

// A worker that does not trust the coordinator's certificate (another CA in --tls-ca) fails the
// TLS handshake at each join. gRPC gives UNAVAILABLE for it, as for a coordinator that is down,
// so the worker keeps trying; its log says what gRPC says of the handshake, and what to check.
TEST_F(SecurityTest, AWorkerThatDoesNotTrustTheCoordinatorSaysWhatToCheck) {
  CapturedLog log;
  auto other_ca = cli::CreateCertificateAuthority("Another CA", Now() - 60, Now() + 3600);
  ASSERT_TRUE(other_ca.ok());
  wire::ClientTls tls = TestPki::Get().WorkerTls("w1");
  tls.ca_pem = other_ca->cert_pem;
  AgentRun run(address_, "w1", tls);
  ASSERT_TRUE(WaitUntil(
      [&] {
        const std::string text = log.text();
        return text.find("trying again in") != std::string::npos || text.find("retrying in") != std::string::npos;
      },
      std::chrono::seconds(120)))
      << "no failed join was logged";
  const std::string text = log.text();
  EXPECT_NE(text.find("could not join the coordinator: join " + address_ + ": failed to connect to all addresses"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("Ssl handshake failed: SSL_ERROR_SSL"), std::string::npos) << text;
  EXPECT_NE(text.find("certificate verify failed (the TLS handshake with the coordinator failed, which trying again "
                      "does not mend: check that --tls-ca (or ca.crt in --tls-dir) is the CA that issued the "
                      "coordinator's certificate, and that the certificate names the host in --coordinator (or "
                      "--tls-server-name)); trying again in "),
            std::string::npos)
      << text;
  EXPECT_TRUE(coordinator_->registry().List().empty());
}

TEST_F(SecurityTest, AWorkerWithAnExpiredCertificateIsRefused) {
  auto expired = cli::IssueCertificate(TestPki::Get().ca(),
                                       {"stale", wire::kWorkerRole, {}, false, Now() - 7200, Now() - 3600});
  ASSERT_TRUE(expired.ok());
  const std::string until = wire::FormatUnixTime(wire::ReadCertificate(expired->cert_pem, "x")->not_after_unix);
  AgentRun run(address_, "stale", Showing(*expired));
  Status s = run.Finish();
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  EXPECT_EQ(s.message(), Refusal("stale", "it expired on " + until));
  EXPECT_TRUE(coordinator_->registry().List().empty());

  // The worker's own flags catch it before it dials.
  const std::string tls_dir = dir_.str() + "/stale";
  ASSERT_TRUE(cli::WriteIdentity(tls_dir, TestPki::Get().ca().cert_pem, *expired).ok());
  wire::TlsFlags flags;
  flags.dir = tls_dir;
  auto loaded = wire::LoadClientTls(flags, {"127.0.0.1", coordinator_->port()}, wire::kWorkerRole);
  EXPECT_EQ(loaded.status().message(), "--tls-cert '" + tls_dir + "/tls.crt': the certificate expired on " + until);
}

TEST_F(SecurityTest, ACallerWithoutACertificateIsRefused) {
  wire::ClientTls anonymous;
  anonymous.ca_pem = TestPki::Get().ca().cert_pem;
  AgentRun run(address_, "anonymous", anonymous);
  Status s = run.Finish();
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  const std::string why =
      "this coordinator uses mutual TLS and the caller presented no certificate: workers and operators need one "
      "(`tessera provision`; --tls-dir, or --tls-cert and --tls-key)";
  EXPECT_EQ(s.message(), "join " + address_ + ": " + why);
  auto jobs = v1::JobService::NewStub(*wire::MakeChannel(address_, anonymous));
  grpc::ClientContext ctx;
  v1::ListJobsResponse listed;
  grpc::Status call = jobs->ListJobs(&ctx, v1::ListJobsRequest(), &listed);
  EXPECT_EQ(call.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(call.error_message(), why);
}

TEST_F(SecurityTest, ACertificateIsOneWorkersNameAndNoOthers) {
  auto as_a = WorkerStub(coordinator_->port(), "a");
  v1::JoinRequest join;
  join.set_join_token(kToken);
  join.set_name("a");
  v1::JoinResponse joined;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(as_a->Join(&ctx, join, &joined).ok());
  }
  // b's certificate may not join as a, nor speak for a's session.
  auto as_b = WorkerStub(coordinator_->port(), "b");
  {
    grpc::ClientContext ctx;
    v1::JoinResponse ignored;
    grpc::Status s = as_b->Join(&ctx, join, &ignored);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(s.error_message(), "join refused for worker 'a': its certificate belongs to worker 'b' (CN); a worker "
                                 "joins under the name its certificate carries");
  }
  {
    grpc::ClientContext ctx;
    v1::HeartbeatRequest beat;
    beat.set_worker_id("a");
    beat.set_session(joined.session());
    v1::HeartbeatResponse ignored;
    grpc::Status s = as_b->Heartbeat(&ctx, beat, &ignored);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(s.error_message(),
              "worker 'a': the call must come from that worker's own certificate; this one is 'b' (OU=tessera-worker)");
  }
}

TEST_F(SecurityTest, TheJobServiceIsForOperatorsAndJoiningForWorkers) {
  auto as_worker = v1::JobService::NewStub(*wire::MakeChannel(address_, TestPki::Get().WorkerTls("w1")));
  grpc::ClientContext ctx;
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = SmallJob(1, 1);
  v1::SubmitJobResponse submitted;
  grpc::Status s = as_worker->SubmitJob(&ctx, submit, &submitted);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(), "the job service needs an operator: a tessera-operator certificate or the admin token; "
                               "this caller's certificate is 'w1' (OU=tessera-worker)");

  auto as_operator = v1::WorkerService::NewStub(*wire::MakeChannel(address_, TestPki::Get().OperatorTls()));
  grpc::ClientContext join_ctx;
  v1::JoinRequest join;
  join.set_join_token(kToken);
  join.set_name("test-operator");
  v1::JoinResponse joined;
  grpc::Status j = as_operator->Join(&join_ctx, join, &joined);
  EXPECT_EQ(j.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(j.error_message(), "join refused for worker 'test-operator': a worker joins with a tessera-worker "
                               "certificate; this caller's is OU='tessera-operator'");
}

// Revocation: a list signed by the client CA refuses a revoked worker at its join, and a worker
// revoked while joined at its next call on the connection it already had, and on the task
// channel it had opened before.
TEST(RevocationTest, ARevokedCertificateIsRefusedAtJoinAndOnAConnectionAdmittedBefore) {
  TempDir dir("revocation");
  const std::string crl_path = dir.str() + "/crl.pem";
  const std::string gone = TestPki::Get().WorkerTls("gone").cert_pem;
  const std::string kept = TestPki::Get().WorkerTls("kept").cert_pem;
  auto write_list = [&](const std::vector<std::string>& revoked) {
    auto crl = cli::RevokeCertificates(TestPki::Get().ca(), "", revoked, Now());
    ASSERT_TRUE(crl.ok()) << crl.status().ToString();
    std::ofstream(crl_path) << *crl;
  };
  write_list({gone});
  server::CoordinatorOptions options = TestCoordinatorOptions(dir.str() + "/state");
  options.tls.crl_path = crl_path;
  options.tls.crl_recheck = std::chrono::milliseconds(0);
  auto started = server::Coordinator::Start(options);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  auto coordinator = std::move(started).value();
  const std::string address = "127.0.0.1:" + std::to_string(coordinator->port());
  const auto refusal = [&](const std::string& cn, const std::string& pem) {
    return "this coordinator uses mutual TLS and refuses the caller's certificate (CN '" + cn +
           "', OU 'tessera-worker'): it is revoked (serial " + wire::ReadCertificate(pem, cn)->serial +
           ", in the certificate revocation list '" + crl_path + "')";
  };

  AgentRun run(address, "gone", TestPki::Get().WorkerTls("gone"));
  Status s = run.Finish();
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  EXPECT_EQ(s.message(), "join " + address + ": " + refusal("gone", gone));

  auto as_kept = WorkerStub(coordinator->port(), "kept");
  v1::JoinRequest join;
  join.set_join_token(kToken);
  join.set_name("kept");
  v1::JoinResponse joined;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(as_kept->Join(&ctx, join, &joined).ok());
  }
  // The task channel kept opened before the revocation: one long call, checked again before
  // each task goes down it.
  grpc::ClientContext channel_ctx;
  v1::TaskChannelRequest open;
  open.set_worker_id("kept");
  open.set_session(joined.session());
  auto channel = as_kept->OpenTaskChannel(&channel_ctx, open);
  channel->WaitForInitialMetadata();
  write_list({gone, kept});
  v1::Task queued;
  queued.mutable_cancel()->set_job_id("job-1-x");
  queued.mutable_cancel()->set_round(1);
  ASSERT_TRUE(coordinator->registry().Send("kept", queued).ok());
  v1::Task received;
  EXPECT_FALSE(channel->Read(&received)) << "a task reached a revoked certificate: " << received.ShortDebugString();
  const grpc::Status channel_end = channel->Finish();
  EXPECT_EQ(channel_end.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(channel_end.error_message(), "task channel of worker 'kept': its certificate " +
                                             refusal("kept", kept).substr(refusal("kept", kept).find("it is revoked")));
  grpc::ClientContext ctx;
  v1::HeartbeatRequest beat;
  beat.set_worker_id("kept");
  beat.set_session(joined.session());
  v1::HeartbeatResponse ignored;
  grpc::Status call = as_kept->Heartbeat(&ctx, beat, &ignored);
  EXPECT_EQ(call.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(call.error_message(), refusal("kept", kept));
}

// TLS without client certificates: join tokens per site, and the admin token for operators.
class TokenSecurityTest : public ::testing::Test {
 protected:
  server::CoordinatorOptions Options() {
    server::CoordinatorOptions options = TestCoordinatorOptions(dir_.str());
    options.tls.client_ca_pem.clear();
    options.join_token.clear();
    options.join_tokens = {{"site-a", "token-of-site-a"}, {"site-b", "token-of-site-b"}};
    options.admin_token = "the-admin-token";
    return options;
  }
  wire::ClientTls Verifying(const std::string& admin_token = "") {
    wire::ClientTls tls;
    tls.ca_pem = TestPki::Get().ca().cert_pem;
    tls.admin_token = admin_token;
    return tls;
  }
  grpc::Status Join(int port, const std::string& name, const std::string& token) {
    auto stub = v1::WorkerService::NewStub(*wire::MakeChannel("127.0.0.1:" + std::to_string(port), Verifying()));
    grpc::ClientContext ctx;
    v1::JoinRequest join;
    join.set_name(name);
    join.set_join_token(token);
    v1::JoinResponse joined;
    return stub->Join(&ctx, join, &joined);
  }
  TempDir dir_{"token-security"};
};

TEST_F(TokenSecurityTest, ANameJoinedWithOneSitesTokenCannotBeTakenWithAnothers) {
  const std::string bound =
      "join refused for worker 'w1': the name is bound to join token 'site-a' since its first join, and this worker "
      "came with join token 'site-b'; a site's workers join with that site's token";
  {
    auto coordinator = server::Coordinator::Start(Options());
    ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
    const int port = (*coordinator)->port();
    ASSERT_TRUE(Join(port, "w1", "token-of-site-a").ok());
    grpc::Status taken = Join(port, "w1", "token-of-site-b");
    EXPECT_EQ(taken.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(taken.error_message(), bound);
    EXPECT_TRUE(Join(port, "w1", "token-of-site-a").ok()) << "its own site rejoins";
    EXPECT_TRUE(Join(port, "w2", "token-of-site-b").ok());
    EXPECT_EQ(Join(port, "w3", "token-of-nobody").error_message(),
              "join refused for worker 'w3': the join token does not match the coordinator's");
  }
  // The binding is in the state directory: a restarted coordinator keeps it.
  auto restarted = server::Coordinator::Start(Options());
  ASSERT_TRUE(restarted.ok()) << restarted.status().ToString();
  EXPECT_EQ(Join((*restarted)->port(), "w1", "token-of-site-b").error_message(), bound);
}

// An operator, and only an operator, forgets a worker that is no longer alive: it is no
// longer listed, also after a restart, and its name joins again with another site's token.
TEST_F(TokenSecurityTest, AForgottenWorkersNameJoinsAgainWithAnyToken) {
  ManualClock clock;  // liveness on a clock the test moves, outliving both coordinators
  server::CoordinatorOptions options = Options();
  options.registry.clock = &clock;
  auto listed = [&](int port) {
    auto stub = v1::JobService::NewStub(
        *wire::MakeChannel("127.0.0.1:" + std::to_string(port), Verifying("the-admin-token")));
    grpc::ClientContext ctx;
    v1::ListWorkersResponse response;
    EXPECT_TRUE(stub->ListWorkers(&ctx, v1::ListWorkersRequest(), &response).ok());
    std::vector<std::string> names;
    for (const auto& w : response.workers()) names.push_back(w.worker_id());
    return names;
  };
  {
    auto coordinator = server::Coordinator::Start(options);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
    const int port = (*coordinator)->port();
    const std::string address = "127.0.0.1:" + std::to_string(port);
    auto forget = [&](const std::string& admin_token, const std::string& name) {
      auto stub = v1::JobService::NewStub(*wire::MakeChannel(address, Verifying(admin_token)));
      grpc::ClientContext ctx;
      v1::ForgetWorkerRequest request;
      request.set_name(name);
      v1::ForgetWorkerResponse response;
      return stub->ForgetWorker(&ctx, request, &response);
    };
    ASSERT_TRUE(Join(port, "w1", "token-of-site-a").ok());
    ASSERT_TRUE(Join(port, "w2", "token-of-site-a").ok());

    EXPECT_EQ(forget("", "w1").error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(forget("token-of-site-a", "w1").error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << "a join token is no operator's credential";
    grpc::Status alive = forget("the-admin-token", "w1");
    EXPECT_EQ(alive.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_EQ(alive.error_message(), "forget worker 'w1': it is alive (joined, and heard from within the heartbeat "
                                     "timeout); stop it first, and forget it once it is no longer alive");
    grpc::Status bad = forget("the-admin-token", "w1\n\x1b[2J");
    EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(bad.error_message(), "forget worker: field 'name' 'w1\\n\\x1b[2J': expected 1 to 128 letters, digits, "
                                   "'-', '_' or '.'");
    grpc::Status unknown = forget("the-admin-token", "nobody");
    EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(unknown.error_message(), "forget worker 'nobody': no such worker");
    EXPECT_EQ(listed(port), (std::vector<std::string>{"w1", "w2"})) << "nothing refused was forgotten";

    // Silent past the heartbeat timeout, w1 is no longer alive: the command line forgets it.
    clock.Advance(std::chrono::milliseconds(options.registry.heartbeat_timeout_ms + 1));
    auto stub = v1::JobService::NewStub(*wire::MakeChannel(address, Verifying("the-admin-token")));
    std::ostringstream out;
    Status forgot = cli::ForgetWorkerCommand(*stub, "w1", out);
    ASSERT_TRUE(forgot.ok()) << forgot.ToString();
    EXPECT_EQ(out.str(), "forgot worker 'w1'; its name may join again as a new worker\n");
    EXPECT_EQ(listed(port), std::vector<std::string>{"w2"});
    EXPECT_EQ(forget("the-admin-token", "w1").error_code(), grpc::StatusCode::NOT_FOUND);
  }
  // Forgotten durably: the restarted coordinator does not list w1, and its name is unbound
  // from site-a's token, while w2 keeps its binding.
  auto restarted = server::Coordinator::Start(options);
  ASSERT_TRUE(restarted.ok()) << restarted.status().ToString();
  const int port = (*restarted)->port();
  EXPECT_EQ(listed(port), std::vector<std::string>{"w2"});
  EXPECT_TRUE(Join(port, "w1", "token-of-site-b").ok());
  EXPECT_EQ(Join(port, "w2", "token-of-site-b").error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(TokenSecurityTest, TheJobServiceNeedsTheAdminToken) {
  auto coordinator = server::Coordinator::Start(Options());
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  auto list = [&](const std::string& token) {
    auto stub = v1::JobService::NewStub(*wire::MakeChannel(address, Verifying(token)));
    grpc::ClientContext ctx;
    v1::ListJobsResponse listed;
    return stub->ListJobs(&ctx, v1::ListJobsRequest(), &listed);
  };
  grpc::Status none = list("");
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(none.error_message(), "the job service needs an operator credential: a tessera-operator certificate "
                                  "(mutual TLS) or the admin token (tessera --admin-token-file)");
  grpc::Status wrong = list("not-the-admin-token");
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(wrong.error_message(), "the job service refused the call: its admin token does not match the coordinator's");
  EXPECT_TRUE(list("the-admin-token").ok());
}

// `tessera delete` through the job service: an operator's call only; an ended job that is not
// the newest goes, a running one and the newest stay.
TEST_F(TokenSecurityTest, AnOperatorDeletesAnEndedJobThatIsNotTheNewest) {
  auto coordinator = server::Coordinator::Start(Options());
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  auto first = (*coordinator)->SubmitJob(SmallJob(1, 1, 1000));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = (*coordinator)->SubmitJob(SmallJob(1, 1, 1000));
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  auto stub = v1::JobService::NewStub(*wire::MakeChannel(address, Verifying("the-admin-token")));
  std::ostringstream out;
  Status running = cli::DeleteCommand(*stub, first->id(), out);
  EXPECT_EQ(running.code(), StatusCode::kFailedPrecondition) << running.ToString();
  EXPECT_NE(running.message().find("only an ended job can be deleted"), std::string::npos) << running.ToString();
  ASSERT_TRUE((*coordinator)->CancelJob(first->id()).ok());
  ASSERT_TRUE((*coordinator)->CancelJob(second->id()).ok());
  // Each ended, its end recorded (its runner finished).
  for (const auto& id : {first->id(), second->id()}) {
    for (int i = 0; i < 500; ++i) {
      auto runner = (*coordinator)->Runner(id);
      if (runner == nullptr || runner->finished()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  auto refused = v1::JobService::NewStub(*wire::MakeChannel(address, Verifying("token-of-site-a")));
  EXPECT_EQ(cli::DeleteCommand(*refused, first->id(), out).code(), StatusCode::kPermissionDenied)
      << "a join token is no operator's credential";
  Status deleted = cli::DeleteCommand(*stub, first->id(), out);
  ASSERT_TRUE(deleted.ok()) << deleted.ToString();
  EXPECT_EQ(out.str(), "deleted " + first->id() +
                           " (it had ended cancelled after 0 committed rounds): its record, rounds and kept models are "
                           "gone\n");
  EXPECT_EQ((*coordinator)->GetJob(first->id()).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(cli::DeleteCommand(*stub, first->id(), out).code(), StatusCode::kNotFound);
  Status newest = cli::DeleteCommand(*stub, second->id(), out);
  EXPECT_EQ(newest.code(), StatusCode::kFailedPrecondition) << newest.ToString();
  EXPECT_NE(newest.message().find("is the newest job"), std::string::npos) << newest.ToString();
}

TEST(TransportSecurityTest, PlaintextIsRefusedOffLoopbackUnlessForced) {
  TempDir dir("plaintext");
  server::CoordinatorOptions options = TestCoordinatorOptions(dir.str());
  options.tls = wire::ServerTls();
  options.tls.insecure = true;
  options.admin_token = "the-admin-token";
  options.listen_address = "0.0.0.0:0";
  auto refused = server::Coordinator::Start(options);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(),
            "--insecure on '0.0.0.0:0' is refused: plaintext is only for a loopback address (127.0.0.1, ::1, "
            "localhost), since anyone on the network could read the join token and the models; serve TLS (--tls-cert, "
            "--tls-key), or add --insecure-force on a network you trust entirely");
  options.tls.insecure_remote = true;  // the credentials are made; nothing binds off loopback in a test
  EXPECT_TRUE(wire::MakeServerCredentials(options.tls, {"0.0.0.0", 0}).ok());

  wire::ClientTls plaintext;
  plaintext.insecure = true;
  auto channel = wire::MakeChannel("10.1.2.3:7070", plaintext);
  EXPECT_EQ(channel.status().message(),
            "--insecure to '10.1.2.3:7070' is refused: plaintext is only for a coordinator on a loopback address; "
            "verify it with --tls-ca, or add --insecure-force on a network you trust entirely");
}

TEST(TransportSecurityTest, TheCoordinatorServesTlsUnlessToldOtherwise) {
  TempDir dir("no-tls");
  server::CoordinatorOptions options = TestCoordinatorOptions(dir.str());
  options.tls = wire::ServerTls();
  options.admin_token = "the-admin-token";
  auto refused = server::Coordinator::Start(options);
  EXPECT_EQ(refused.status().message(),
            "the coordinator serves TLS: give --tls-cert and --tls-key (or --tls-dir; `tessera provision` makes them), "
            "or --insecure for plaintext on a loopback address");
}

}  // namespace
}  // namespace tessera::testing
