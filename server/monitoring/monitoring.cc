#include "server/monitoring/monitoring.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <initializer_list>
#include <map>
#include <thread>
#include <utility>

#include "base/escape.h"
#include "base/host_port.h"
#include "base/metrics.h"
#include "proto/job_mapping.h"
#include "proto/json.h"
#include "proto/list_reply.h"
#include "proto/revocation.h"
#include "server/coordinator.h"
#include "server/dashboard/assets.h"
#include "server/monitoring/job_page.h"

namespace tessera::server {
namespace {


HttpResponse JsonResponse(const google::protobuf::Message& message) {
  return HttpResponse{200, "application/json", wire::ToJson(message), {{"Cache-Control", "no-store"}}};
}

HttpResponse ErrorResponse(const Status& status) {
  int code = 500;
  switch (status.code()) {
    case StatusCode::kNotFound: code = 404; break;
    case StatusCode::kInvalidArgument: code = 400; break;
    default: break;
  }
  return HttpResponse{code, "text/plain; charset=utf-8", status.message() + "\n", {}};
}

// The job id a query names, checked as the job service checks ids.
Result<std::string> JobParam(const HttpRequest& request, const char* name) {
  auto it = request.params.find(name);
  if (it == request.params.end() || it->second.empty()) {
    return InvalidArgumentError(std::string("expected ?") + name + "=JOB_ID");
  }
  const std::string& id = it->second;
  bool ok = id.size() <= 64;
  for (char c : id) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_');
  if (!ok) return InvalidArgumentError("job id " + QuoteUntrusted(id, 64) + ": expected letters, digits, '-' or '_'");
  return id;
}

// ?from=ROUND: the first round wanted (0, the default, from the first).
Result<uint32_t> FromRoundParam(const HttpRequest& request) {
  auto it = request.params.find("from");
  if (it == request.params.end() || it->second.empty()) return 0u;
  const std::string& text = it->second;
  uint32_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    return InvalidArgumentError("from " + QuoteUntrusted(text, 16) + ": expected a round number, 0 to 4294967295");
  }
  return value;
}

// A query's parameters are those the path takes, no others: a misspelt one ("form=3") is an
// error naming it, not a silent default.
Status OnlyParams(const HttpRequest& request, const std::string& path, std::initializer_list<const char*> known) {
  for (const auto& [name, value] : request.params) {
    if (std::find_if(known.begin(), known.end(), [&](const char* k) { return name == k; }) != known.end()) continue;
    std::string names;
    size_t i = 0;
    for (const char* k : known) {
      if (i > 0) names += i + 1 == known.size() ? " and " : ", ";
      names += k;
      ++i;
    }
    return InvalidArgumentError("parameter " + QuoteUntrusted(name, 32) + ": " + path + " takes " + names);
  }
  return Status::Ok();
}

bool IsPublic(const std::string& path) {
  for (const auto& asset : DashboardAssets()) {
    if (path == asset.path) return true;
  }
  return path == "/favicon.ico";
}

}  // namespace

Result<std::unique_ptr<MonitoringServer>> MonitoringServer::Start(Coordinator* c, MonitoringOptions options) {
  ASSIGN_OR_RETURN(HostPort listen, ParseHostPort("--metrics-listen", options.listen, PortZero::kAllowed));
  if (options.tls.insecure && !options.tls.insecure_remote && !IsLoopbackHost(listen.host)) {
    return InvalidArgumentError("--metrics-listen " + listen.ToString() +
                                ": the coordinator runs --insecure, so its monitoring port is plaintext too: "
                                "give a loopback address (or --insecure-force on a network you trust)");
  }
  HttpEndpointOptions http;
  http.host = listen.host;
  http.port = listen.port;
  http.max_streams = options.max_event_streams;
  http.max_connections = options.max_connections;
  http.max_connections_per_address = options.max_connections_per_address;
  if (!options.tls.insecure) {
    http.cert_pem = options.tls.cert_pem;
    http.key_pem = options.tls.key_pem;
    http.client_ca_pem = options.tls.client_ca_pem;
  }
  const auto authorize = [c](const HttpRequest& request) -> Status {
    if (IsPublic(request.path)) return Status::Ok();
    if (request.client_certificate && c->revocation() != nullptr &&
        c->revocation()->Revoked(request.client_serial, nullptr)) {
      return PermissionDeniedError("the monitoring port refuses the caller's certificate (CN " +
                                   QuoteUntrusted(request.client_cn) + ", OU " + QuoteUntrusted(request.client_ou) +
                                   "): " + c->revocation()->RevokedReason(request.client_serial));
    }
    wire::PeerIdentity peer;
    peer.has_certificate = request.client_certificate;
    peer.common_name = request.client_cn;
    peer.role = request.client_ou;
    std::string authorization = request.authorization.substr(0, 2048);
    return c->access().CheckOperator(peer, request.authorization.empty() ? nullptr : &authorization,
                                     AccessPolicy::Door::kMonitoringPort);
  };
  http.authorize = authorize;
  for (const auto& asset : DashboardAssets()) {
    const DashboardAsset a = asset;
    http.routes.push_back({a.path, [a](const HttpRequest&) {
                             return HttpResponse{200, a.content_type, std::string(a.data, a.size),
                                                 {{"Cache-Control", "no-cache"},
                                                  // No other site may frame the dashboard
                                                  // (clickjacking an operator's session).
                                                  {"Content-Security-Policy",
                                                   "default-src 'self'; style-src 'self' 'unsafe-inline'; "
                                                   "frame-ancestors 'none'"},
                                                  {"X-Frame-Options", "DENY"},
                                                  {"X-Content-Type-Options", "nosniff"}}};
                           },
                           nullptr});
  }
  // Browsers ask for an icon on their own; the page has none: "no content" rather than a 404.
  http.routes.push_back({"/favicon.ico", [](const HttpRequest&) {
                           return HttpResponse{204, "image/x-icon", "", {{"Cache-Control", "max-age=86400"}}};
                         },
                         nullptr});
  http.routes.push_back({"/metrics", [](const HttpRequest&) {
                           return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8",
                                               metrics::Global().Render(), {}};
                         },
                         nullptr});
  http.routes.push_back({"/api/jobs", [c](const HttpRequest&) {
                           auto jobs = c->JobsReply();
                           if (!jobs.ok()) return ErrorResponse(jobs.status());
                           return JsonResponse(*jobs);
                         },
                         nullptr});
  http.routes.push_back({"/api/job", [c](const HttpRequest& request) {
                           if (Status s = OnlyParams(request, "/api/job", {"id", "from"}); !s.ok()) {
                             return ErrorResponse(s);
                           }
                           auto id = JobParam(request, "id");
                           if (!id.ok()) return ErrorResponse(id.status());
                           auto from = FromRoundParam(request);
                           if (!from.ok()) return ErrorResponse(from.status());
                           auto page = c->JobWithRounds(*id, *from, kDashboardPageBytes);
                           if (!page.ok()) return ErrorResponse(page.status());
                           // Cut to the dashboard's bounds (server/monitoring/job_page.h).
                           return HttpResponse{200, "application/json", DashboardJobJson(std::move(*page)),
                                               {{"Cache-Control", "no-store"}}};
                         },
                         nullptr});
  http.routes.push_back({"/api/workers", [c](const HttpRequest&) {
                           // Bounded as the job service's ListWorkers: a federation of
                           // 100,000 workers is not a reply of a gigabyte every 2 s.
                           v1::ListWorkersResponse response;
                           response.set_more(c->registry().ListInto(response.mutable_workers()));
                           return JsonResponse(response);
                         },
                         nullptr});
  // The job each time its state or committed rounds change; a comment line every 15 s
  // otherwise. The page then fetches /api/job for the rounds.
  http.routes.push_back({"/api/events", nullptr, [c, authorize](const HttpRequest& request, const EventSender& send) {
                           auto id = JobParam(request, "job");
                           if (!id.ok()) {
                             send("error", id.status().message());
                             return;
                           }
                           std::string last;
                           for (;;) {
                             // Asked again on every pass: a certificate revoked while its stream is
                             // open loses the stream within one pass, as its next request would be
                             // refused.
                             if (Status allowed = authorize(request); !allowed.ok()) {
                               send("error", allowed.message());
                               return;
                             }
                             // Without the last round's reports (about 640 bytes a client): the page
                             // reads the rounds from /api/job.
                             auto job = c->ListedJob(*id);
                             if (!job.ok()) {
                               send("error", job.status().message());
                               return;
                             }
                             // A change of state, rounds or error is what the page follows; the job is
                             // written out as JSON only then, not every 250 ms.
                             std::string now = std::to_string(job->state()) + "/" + std::to_string(job->rounds_committed()) +
                                               "/" + job->error();
                             if (now != last) {
                               if (!send("job", wire::ToJson(*job))) return;
                               last = std::move(now);
                             } else if (!send("", "")) {
                               return;
                             }
                             // An ended job changes no more: the stream ends, and gives its
                             // connection back to the endpoint's few threads (the page stops
                             // following at "end").
                             const v1::JobState state = job->state();
                             if (wire::JobEnded(state)) {
                               send("end", "");
                               return;
                             }
                             std::this_thread::sleep_for(std::chrono::milliseconds(250));
                           }
                         }});
  auto endpoint = HttpEndpoint::Start(std::move(http));
  if (!endpoint.ok()) return Status(endpoint.status().code(), "--metrics-listen: " + endpoint.status().message());
  std::unique_ptr<MonitoringServer> server(new MonitoringServer());
  server->endpoint_ = std::move(endpoint).value();
  // Gauges read when scraped: workers and jobs by state, open streams.
  auto& registry = metrics::Global();
  auto& workers = registry.Gauge("tessera_workers", "Workers known to the coordinator by state: alive or gone.", {"state"});
  auto& jobs = registry.Gauge("tessera_jobs", "Jobs by state.", {"state"});
  auto& streams = registry.Gauge("tessera_open_streams",
                                 "Streams open at the coordinator: task channels, downloads, uploads, watches, exports, rendezvous waits.");
  auto& queue = registry.Gauge("tessera_upload_queue",
                               "Uploads waiting for the upload memory budget before their bytes are read.");
  auto& buffered = registry.Gauge("tessera_upload_buffer_bytes", "Bytes of the upload memory budget held now.");
  server->collector_ = registry.AddCollector([c, &workers, &jobs, &streams, &queue, &buffered] {
    queue.With().Set(static_cast<double>(c->upload_budget().waiting()));
    buffered.With().Set(static_cast<double>(c->upload_budget().in_use()));
    const WorkerRegistry::Counts counts = c->registry().CountByLiveness();
    workers.With({"alive"}).Set(static_cast<double>(counts.alive));
    workers.With({"gone"}).Set(static_cast<double>(counts.gone));
    std::map<std::string, double> by_state;
    for (int s = v1::JobState_MIN; s <= v1::JobState_MAX; ++s) {
      if (s != v1::JOB_STATE_UNSPECIFIED && v1::JobState_IsValid(s)) by_state[wire::JobStateName(static_cast<v1::JobState>(s))] = 0;
    }
    for (const auto& [state, count] : c->JobCounts()) by_state[wire::JobStateName(state)] += static_cast<double>(count);
    // Stored jobs whose row could not be read at start (the log names them).
    by_state["unreadable"] = static_cast<double>(c->UnreadableJobs());
    for (const auto& [state, count] : by_state) jobs.With({state}).Set(count);
    streams.With().Set(static_cast<double>(c->streams().open()));
  });
  return server;
}

MonitoringServer::~MonitoringServer() { Stop(); }

void MonitoringServer::Stop() {
  if (collector_ != 0) {
    metrics::Global().RemoveCollector(collector_);
    collector_ = 0;
  }
  if (endpoint_) endpoint_->Stop();
}

}  // namespace tessera::server
