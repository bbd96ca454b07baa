// The dashboard's files, compiled into the coordinator (cmake/EmbedFiles.cmake) so that it
// serves them with nothing fetched at run time: the page, its script and style, and uPlot
// (vendored from npm, server/dashboard/vendor/uplot/VENDORED.md).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace tessera::server {

struct DashboardAsset {
  const char* path;          // served under this path: "/", "/dashboard.js", ...
  const char* content_type;
  const char* data;
  size_t size;
};

const std::vector<DashboardAsset>& DashboardAssets();

}  // namespace tessera::server
