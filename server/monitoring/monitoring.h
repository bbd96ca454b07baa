// What the coordinator shows people and Prometheus on its own HTTP port (--metrics-listen):
//
//   /metrics                 Prometheus' text format: the coordinator's tessera_* metrics and
//                            process_* (docs/MONITORING.md lists them all)
//   /                        the dashboard: jobs, per-job latency by phase, accuracy and loss,
//                            per-round worker timelines, the workers (server/dashboard/)
//   /api/jobs, /api/job?id=J[&from=ROUND] (a page of its rounds, bounded: job_page.h;
//   next_round: where the next starts), /api/workers
//                            read-only JSON for the dashboard (proto3's JSON mapping)
//   /api/events?job=J        server-sent events: the job each time it changes
//
// Served over TLS with the coordinator's certificate unless the coordinator runs --insecure.
// The page's own files are public (they hold no data); everything else needs an operator, as
// the job service does: an operator certificate under mutual TLS, or the admin token as
// "Authorization: Bearer TOKEN" (the page asks for it and keeps it for the tab only).
// Read-only: nothing here changes a job.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/http_endpoint.h"
#include "base/status.h"
#include "proto/transport_security.h"

namespace tessera::server {

class Coordinator;

struct MonitoringOptions {
  std::string listen;  // HOST:PORT; port 0 picks one
  wire::ServerTls tls;
  int max_event_streams = 4;  // half the endpoint's threads: /metrics and the API stay served
  // The endpoint's connection limits (--metrics-max-connections,
  // --metrics-max-connections-per-address: base/http_limit_flags.h).
  int max_connections = HttpEndpointOptions{}.max_connections;
  int max_connections_per_address = HttpEndpointOptions{}.max_connections_per_address;
};

class MonitoringServer {
 public:
  // Serves `coordinator`, which must outlive the returned server.
  static Result<std::unique_ptr<MonitoringServer>> Start(Coordinator* coordinator, MonitoringOptions options);
  ~MonitoringServer();

  int port() const { return endpoint_->port(); }
  std::string url() const { return endpoint_->url(); }
  void Stop();

 private:
  MonitoringServer() = default;
  std::unique_ptr<HttpEndpoint> endpoint_;
  uint64_t collector_ = 0;  // the scrape-time gauges' collector in metrics::Global()
};

}  // namespace tessera::server
