// SqliteStateStore::DeleteJob: a job's checkpoint files, then its rows.
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "base/escape.h"
#include "base/names.h"
#include "server/state/sqlite_state_store.h"
#include "server/state/sqlite_statement.h"

namespace tessera::server {

using sqlite::SqliteError;
using sqlite::Statement;

Result<bool> SqliteStateStore::DeleteJob(const std::string& job_id) {
  if (!IsName(job_id, kMaxJobIdBytes)) {
    return InvalidArgumentError("delete job " + QuoteUntrusted(job_id, kMaxJobIdBytes) + ": not a job id");
  }
  std::lock_guard<std::mutex> lock(write_mu_);
  // The files first: a delete cut short leaves the rows, and the job is deleted again later.
  const std::string dir = state_dir_ + "/checkpoints";
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const auto file = ParseCheckpointFileName(it->path().filename().string());
    if (file && file->job_id == job_id) files.push_back(it->path());
  }
  if (ec) return InternalError("delete job " + job_id + ": cannot list " + QuoteUntrusted(dir) + ": " + ec.message());
  for (const auto& file : files) {
    std::error_code removed;
    if (!std::filesystem::remove(file, removed) && removed) {
      return InternalError("delete job " + job_id + ": cannot remove " + QuoteUntrusted(file.string()) + ": " +
                           removed.message());
    }
  }
  // The removals are durable before the rows go: a power cut after the rows' commit could
  // otherwise bring the files back with no row to name them, and a start keeps the files of
  // jobs the database does not know.
  if (!files.empty()) RETURN_IF_ERROR(SyncStateDirectory(dir).WithContext("delete job " + job_id));
  // A checkpoint written for the job and never committed went with its file: a commit of it
  // now would name a file that is gone.
  std::erase_if(written_, [&](const auto& entry) { return entry.first == job_id; });
  bool deleted = false;
  RETURN_IF_ERROR(InTransactionLocked("delete job " + job_id, [&]() -> Status {
    for (const char* sql : {"DELETE FROM rounds WHERE job_id = ?", "DELETE FROM seats WHERE job_id = ?",
                            "DELETE FROM cancels WHERE job_id = ?", "DELETE FROM jobs WHERE id = ?"}) {
      Statement st(writer_, sql);
      if (!st.ok()) return SqliteError(writer_, std::string("prepare ") + sql);
      RETURN_IF_ERROR(st.BindText(1, "job_id", job_id));
      if (st.Step() != SQLITE_DONE) return SqliteError(writer_, sql);
      deleted = sqlite3_changes(writer_) > 0;  // the last statement's: the job's row
    }
    return Status::Ok();
  }));
  return deleted;
}

}  // namespace tessera::server
