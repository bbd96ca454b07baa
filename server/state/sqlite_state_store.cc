#include "server/state/sqlite_state_store.h"

#include <spdlog/spdlog.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>

#include "base/escape.h"
#include "base/names.h"
#include "proto/job_mapping.h"
#include "server/state/sqlite_statement.h"

namespace tessera::server {
namespace {

using sqlite::Exec;
using sqlite::QueryText;
using sqlite::SqliteError;
using sqlite::Statement;

static_assert(kMaxCheckpointBytes >= static_cast<uint64_t>(wire::kMaxModelMemoryBytes) + (uint64_t{512} << 20),
              "a checkpoint holds at most the model memory a job may take, and its selection history");

}  // namespace

SqliteStateStore::SqliteStateStore(std::string state_dir, sqlite3* writer)
    : state_dir_(std::move(state_dir)), writer_(writer) {}

SqliteStateStore::~SqliteStateStore() {
  // The reader first: the last connection to close folds the log into the database file,
  // and only the writer may.
  sqlite3_close(reader_);
  sqlite3_close(writer_);
}

Result<std::unique_ptr<SqliteStateStore>> SqliteStateStore::Open(const std::string& state_dir) {
  // Each directory made here is durable before any file is written in it: its parent is
  // synced after its mkdir.
  if (Status made = CreateDirectoriesDurably(state_dir + "/checkpoints"); !made.ok()) {
    return InvalidArgumentError("state directory '" + state_dir + "': " + made.message());
  }
  const std::string db_path = state_dir + "/coordinator.db";
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string message = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return InternalError("cannot open '" + db_path + "': " + message);
  }
  std::unique_ptr<SqliteStateStore> store(new SqliteStateStore(state_dir, db));
  sqlite3_busy_timeout(db, 5000);
  // A file the process may not write opens read-only without a word: every write would fail.
  if (sqlite3_db_readonly(db, "main") != 0) {
    return PermissionDeniedError("cannot open '" + db_path + "' for writing: it is read-only to this process");
  }
  // The reads' connection relies on WAL: in another journal mode readers and the writer wait
  // for each other, and a read could fail where it waited too long.
  // Every statement's error names the file: one that is no database, or a damaged one, fails
  // the first of them.
  const std::string where = "'" + db_path + "'";
  auto queried = QueryText(db, "PRAGMA journal_mode=WAL");
  if (!queried.ok()) return queried.status().WithContext(where);
  const std::string journal_mode = std::move(queried).value();
  if (journal_mode != "wal") {
    return FailedPreconditionError("cannot put '" + db_path + "' in WAL mode: its journal mode stays " +
                                   QuoteUntrusted(journal_mode, 32));
  }
  RETURN_IF_ERROR(Exec(db, "PRAGMA synchronous=FULL").WithContext(where));
  RETURN_IF_ERROR(Exec(db,
      // ended_unix_ms: when the row was first written ended (StateStore::InsertJob).
      "CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, number INTEGER, job BLOB NOT NULL, ended_unix_ms INTEGER);"
      "CREATE TABLE IF NOT EXISTS rounds (job_id TEXT NOT NULL, round INTEGER NOT NULL, record BLOB NOT NULL,"
      "  checkpoint TEXT NOT NULL, PRIMARY KEY (job_id, round));"
      "CREATE TABLE IF NOT EXISTS workers (id TEXT PRIMARY KEY, worker BLOB NOT NULL);"
      "CREATE TABLE IF NOT EXISTS seats (job_id TEXT NOT NULL, worker_id TEXT NOT NULL, party INTEGER NOT NULL,"
      "  PRIMARY KEY (job_id, worker_id));"
      "CREATE TABLE IF NOT EXISTS worker_names (name TEXT PRIMARY KEY, credential TEXT NOT NULL,"
      "  bound_unix_ms INTEGER NOT NULL);"
      // A cancel asked for, apart from the job's row, which the job's thread writes over.
      "CREATE TABLE IF NOT EXISTS cancels (job_id TEXT PRIMARY KEY, requested_unix_ms INTEGER NOT NULL);")
                      .WithContext(where));
  RETURN_IF_ERROR(store->AddJobEndColumn().WithContext(where));
  RETURN_IF_ERROR(store->OpenReader(db_path));
  return store;
}

Status SqliteStateStore::AddJobEndColumn() {
  std::lock_guard<std::mutex> lock(write_mu_);
  auto has = QueryText(writer_, "SELECT COUNT(*) FROM pragma_table_info('jobs') WHERE name = 'ended_unix_ms'");
  if (!has.ok()) return has.status();
  if (*has != "0") return Status::Ok();
  // A database written before ends were recorded: its ended jobs are taken to have ended now,
  // at the first start that records ends, so that none is deleted earlier than it would have
  // been had its end been recorded (a retention counts from it). A row that does not parse
  // is left without one.
  const int64_t now = StoreUnixMillis();
  return InTransactionLocked("record the end of the jobs that ended", [&]() -> Status {
    RETURN_IF_ERROR(Exec(writer_, "ALTER TABLE jobs ADD COLUMN ended_unix_ms INTEGER"));
    std::vector<std::string> ended;
    {
      Statement st(writer_, "SELECT id, job FROM jobs");
      if (!st.ok()) return SqliteError(writer_, "prepare read jobs");
      int rc;
      while ((rc = st.Step()) == SQLITE_ROW) {
        v1::Job job;
        if (job.ParseFromString(st.ColumnBlob(1)) && wire::JobEnded(job.state())) ended.push_back(st.ColumnBlob(0));
      }
      if (rc != SQLITE_DONE) return SqliteError(writer_, "read jobs");
    }
    for (const std::string& id : ended) {
      Statement st(writer_, "UPDATE jobs SET ended_unix_ms = ? WHERE id = ?");
      if (!st.ok()) return SqliteError(writer_, "prepare record job end");
      RETURN_IF_ERROR(st.BindInt(1, "ended_unix_ms", now));
      RETURN_IF_ERROR(st.BindText(2, "id", id));
      if (st.Step() != SQLITE_DONE) return SqliteError(writer_, "record the end of job " + QuoteUntrusted(id, 128));
    }
    return Status::Ok();
  });
}

Status SqliteStateStore::OpenReader(const std::string& db_path) {
  std::lock_guard<std::mutex> lock(read_mu_);
  const int rc = sqlite3_open_v2(db_path.c_str(), &reader_, SQLITE_OPEN_READONLY | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    const std::string message = reader_ ? sqlite3_errmsg(reader_) : "out of memory";
    sqlite3_close(reader_);
    reader_ = nullptr;
    return InternalError("cannot open '" + db_path + "' read-only, for the state store's reads: " + message);
  }
  // A reader waits only while SQLite recovers the log after a crash, or when a lock on the
  // log's index is briefly held.
  sqlite3_busy_timeout(reader_, 5000);
  // A first read (of the schema, which the writer has read already), so that a log or an
  // index the process cannot read is an error here, not at the first job listed.
  Statement first(reader_, "SELECT COUNT(*) FROM sqlite_master");
  if (!first.ok() || first.Step() != SQLITE_ROW) {
    return InternalError("cannot read '" + db_path + "' read-only, for the state store's reads: " +
                         sqlite3_errmsg(reader_));
  }
  return Status::Ok();
}

std::string SqliteStateStore::CheckpointPath(const std::string& job_id, uint32_t round) const {
  return state_dir_ + "/checkpoints/" + job_id + "-round-" + std::to_string(round) + ".ckpt";
}

std::optional<SqliteStateStore::CheckpointFileName> SqliteStateStore::ParseCheckpointFileName(const std::string& name) {
  constexpr std::string_view kRound = "-round-", kExtension = ".ckpt", kTemporary = ".tmp";
  CheckpointFileName file;
  std::string_view rest(name);
  file.temporary = rest.size() > kTemporary.size() && rest.substr(rest.size() - kTemporary.size()) == kTemporary;
  if (file.temporary) rest.remove_suffix(kTemporary.size());
  if (rest.size() < kExtension.size() || rest.substr(rest.size() - kExtension.size()) != kExtension) return std::nullopt;
  rest.remove_suffix(kExtension.size());
  const size_t at = rest.rfind(kRound);
  if (at == std::string_view::npos) return std::nullopt;
  const std::string_view digits = rest.substr(at + kRound.size());
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string_view::npos) {
    return std::nullopt;
  }
  file.job_id = std::string(rest.substr(0, at));
  for (const char c : digits) file.round = file.round * 10 + static_cast<uint32_t>(c - '0');
  return file;
}

namespace {

// The number the next job takes on `db`: one past the largest stored, 1 for the first job.
// The largest must be an integer from 0 to INT64_MAX - 1: past it the sum would overflow
// (SQLite makes it a real, which reads back as INT64_MAX for every later job), and text or
// a blob (which SQLite ranks above every number) would give 1 again.
Result<int64_t> NextNumber(sqlite3* db, const std::string& db_path) {
  Statement st(db, "SELECT MAX(number) FROM jobs");
  if (!st.ok()) return SqliteError(db, "prepare next job number");
  if (st.Step() != SQLITE_ROW) return SqliteError(db, "next job number");
  const int type = st.ColumnType(0);
  if (type == SQLITE_NULL) return 1;
  const int64_t largest = type == SQLITE_INTEGER ? st.ColumnInt(0) : -1;
  if (type != SQLITE_INTEGER || largest < 0 || largest == INT64_MAX) {
    return DataLossError("'" + db_path + "': jobs table, column 'number': the largest is " + st.Shown(0, type) +
                         "; expected a number from 0 to " + std::to_string(INT64_MAX - 1) +
                         ", so that the next job's number fits");
  }
  return largest + 1;
}

}  // namespace

Status SqliteStateStore::InsertJob(const v1::Job& job) {
  std::lock_guard<std::mutex> lock(write_mu_);
  // The number is read in the insert's own transaction.
  return InTransactionLocked("insert job " + QuoteUntrusted(job.id(), kMaxJobIdBytes), [&]() -> Status {
    ASSIGN_OR_RETURN(const int64_t number, NextNumber(writer_, state_dir_ + "/coordinator.db"));
    Statement st(writer_, "INSERT INTO jobs (id, number, job) VALUES (?, ?, ?)");
    if (!st.ok()) return SqliteError(writer_, "prepare insert job");
    RETURN_IF_ERROR(st.BindText(1, "id", job.id()));
    RETURN_IF_ERROR(st.BindInt(2, "number", number));
    RETURN_IF_ERROR(st.BindBlob(3, "job", JobRow(job).SerializeAsString()));
    if (st.Step() != SQLITE_DONE) {
      if (sqlite3_extended_errcode(writer_) == SQLITE_CONSTRAINT_PRIMARYKEY) {
        return AlreadyExistsError("the job exists already");
      }
      return SqliteError(writer_, "insert job");
    }
    return Status::Ok();
  });
}

Status SqliteStateStore::UpdateJob(const v1::Job& job) {
  std::lock_guard<std::mutex> lock(write_mu_);
  return UpdateJobRowLocked(job);
}

Status SqliteStateStore::UpdateJobRowLocked(const v1::Job& job) {
  // The end's time is kept from the first write that ended the job (StateStore::InsertJob).
  Statement st(writer_,
               "UPDATE jobs SET job = ?, ended_unix_ms = CASE WHEN ? THEN COALESCE(ended_unix_ms, ?) END WHERE id = ?");
  if (!st.ok()) return SqliteError(writer_, "prepare update job");
  RETURN_IF_ERROR(st.BindBlob(1, "job", JobRow(job).SerializeAsString()));
  RETURN_IF_ERROR(st.BindInt(2, "ended", wire::JobEnded(job.state()) ? 1 : 0));
  RETURN_IF_ERROR(st.BindInt(3, "ended_unix_ms", StoreUnixMillis()));
  RETURN_IF_ERROR(st.BindText(4, "id", job.id()));
  if (st.Step() != SQLITE_DONE) return SqliteError(writer_, "update job " + QuoteUntrusted(job.id(), kMaxJobIdBytes));
  return Status::Ok();
}

Status SqliteStateStore::InTransactionLocked(const std::string& what, const std::function<Status()>& body) {
  Status s = Exec(writer_, "BEGIN IMMEDIATE");
  if (s.ok()) {
    s = body();
    if (s.ok()) s = Exec(writer_, "COMMIT");
    if (!s.ok()) Exec(writer_, "ROLLBACK").ok();
  }
  return s.WithContext(what);
}

Status SqliteStateStore::InReadTransactionLocked(const std::function<Status()>& body) {
  RETURN_IF_ERROR(Exec(reader_, "BEGIN"));
  Status s = body();
  // Ending a read transaction writes nothing.
  if (s.ok()) s = Exec(reader_, "COMMIT");
  if (!s.ok()) Exec(reader_, "ROLLBACK").ok();
  return s;
}

namespace {

// A job's row read back: the job it parses to must be the one its key names, and the key a
// job id. Every path the job's runner makes (its checkpoints' files, its rendezvous keys) is
// made from the id in the row, and the coordinator runs one runner a key: a row edited to
// name another job, or "../x", would write outside the state directory or run one job twice.
Status CheckJobRow(const std::string& key, const std::string& blob, v1::Job* job) {
  const std::string where = "jobs table: job " + QuoteUntrusted(key, kMaxJobIdBytes);
  if (!job->ParseFromString(blob)) return DataLossError(where + ": corrupt row");
  if (!IsName(key, kMaxJobIdBytes)) {
    return DataLossError(where + ": field 'id': expected 1 to " + std::to_string(kMaxJobIdBytes) +
                         " letters, digits, '-', '_' or '.'");
  }
  if (job->id() != key) {
    return DataLossError(where + ": field 'id': the row holds job " + QuoteUntrusted(job->id(), kMaxJobIdBytes) +
                         "; expected the row's own id");
  }
  return Status::Ok();
}

}  // namespace

// A job's row, whether its cancel was asked for and when it ended.
constexpr char kJobColumns[] =
    "j.id, j.job, EXISTS (SELECT 1 FROM cancels c WHERE c.job_id = j.id), j.ended_unix_ms";

Result<v1::Job> SqliteStateStore::GetJob(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(read_mu_);
  Statement st(reader_, std::string("SELECT ") + kJobColumns + " FROM jobs j WHERE j.id = ?");
  if (!st.ok()) return SqliteError(reader_, "prepare get job");
  RETURN_IF_ERROR(st.BindText(1, "id", job_id));
  const int rc = st.Step();
  if (rc == SQLITE_DONE) return NotFoundError("no job " + QuoteUntrusted(job_id, kMaxJobIdBytes));
  if (rc != SQLITE_ROW) return SqliteError(reader_, "read job " + QuoteUntrusted(job_id, kMaxJobIdBytes));
  v1::Job job;
  RETURN_IF_ERROR(CheckJobRow(st.ColumnBlob(0), st.ColumnBlob(1), &job));
  return WithRecordedCancel(std::move(job), st.ColumnInt(2) != 0);
}

Result<std::vector<v1::Job>> SqliteStateStore::ListJobs() {
  ASSIGN_OR_RETURN(JobList list, ListNewestJobs(SIZE_MAX));
  if (!list.damaged.empty()) {
    return DataLossError("jobs table: job " + QuoteUntrusted(list.damaged.front(), 128) + ": corrupt row");
  }
  return std::move(list.jobs);
}

Result<StateStore::JobList> SqliteStateStore::ListNewestJobs(size_t max_jobs) {
  std::lock_guard<std::mutex> lock(read_mu_);
  JobList list;
  // One read, so that the total counts the rows listed.
  RETURN_IF_ERROR(InReadTransactionLocked([&]() -> Status {
    {
      Statement count(reader_, "SELECT COUNT(*) FROM jobs");
      if (!count.ok()) return SqliteError(reader_, "prepare count jobs");
      if (count.Step() != SQLITE_ROW) return SqliteError(reader_, "count jobs");
      list.total = static_cast<uint64_t>(count.ColumnInt(0));
    }
    Statement st(reader_, std::string("SELECT ") + kJobColumns +
                              " FROM (SELECT id, job, number, ended_unix_ms FROM jobs ORDER BY number DESC LIMIT ?) j"
                              " ORDER BY j.number");
    if (!st.ok()) return SqliteError(reader_, "prepare list jobs");
    // A negative limit is none.
    RETURN_IF_ERROR(
        st.BindInt(1, "limit", max_jobs >= static_cast<size_t>(INT64_MAX) ? -1 : static_cast<int64_t>(max_jobs)));
    int rc;
    while ((rc = st.Step()) == SQLITE_ROW) {
      v1::Job job;
      const std::string key = st.ColumnBlob(0);
      if (!CheckJobRow(key, st.ColumnBlob(1), &job).ok()) {
        list.damaged.push_back(key.substr(0, 128));
        continue;
      }
      // An end's time edited to something else than an integer is no end recorded.
      if (st.ColumnType(3) == SQLITE_INTEGER) list.ended_unix_ms[key] = st.ColumnInt(3);
      list.jobs.push_back(WithRecordedCancel(std::move(job), st.ColumnInt(2) != 0));
    }
    // A step that ends in an error (a damaged page, an I/O error) is not the end of the table.
    if (rc != SQLITE_DONE) return SqliteError(reader_, "list jobs");
    return Status::Ok();
  }));
  return list;
}

Status SqliteStateStore::RequestCancel(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(write_mu_);
  // Whether the job is known is read in the write's own transaction.
  return InTransactionLocked("record the cancel of job " + QuoteUntrusted(job_id, kMaxJobIdBytes), [&]() -> Status {
    Statement st(writer_, "INSERT OR IGNORE INTO cancels (job_id, requested_unix_ms) SELECT id, ? FROM jobs WHERE id = ?");
    if (!st.ok()) return SqliteError(writer_, "prepare record cancel");
    RETURN_IF_ERROR(st.BindInt(1, "requested_unix_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch()).count()));
    RETURN_IF_ERROR(st.BindText(2, "id", job_id));
    if (st.Step() != SQLITE_DONE) return SqliteError(writer_, "record the cancel");
    if (sqlite3_changes(writer_) == 0) {
      Statement known(writer_, "SELECT 1 FROM cancels WHERE job_id = ?");
      if (!known.ok()) return SqliteError(writer_, "prepare read cancel");
      RETURN_IF_ERROR(known.BindText(1, "job_id", job_id));
      const int rc = known.Step();
      if (rc == SQLITE_DONE) return NotFoundError("no such job");
      if (rc != SQLITE_ROW) return SqliteError(writer_, "read the cancel");
    }
    return Status::Ok();
  });
}

Result<uint64_t> SqliteStateStore::NextJobNumber() {
  std::lock_guard<std::mutex> lock(read_mu_);
  ASSIGN_OR_RETURN(const int64_t number, NextNumber(reader_, state_dir_ + "/coordinator.db"));
  return static_cast<uint64_t>(number);
}

Status SqliteStateStore::SaveInitialModel(const std::string& job_id, const TensorSet& model) {
  std::string header;
  return WriteFileAtomically(CheckpointPath(job_id, 0), CheckpointPieces(model, {}, &header));
}

Status SqliteStateStore::WriteCheckpoint(const std::string& job_id, uint32_t round, const TensorSet& global_model,
                                         const TensorSet& extra) {
  {
    // Whatever was written for this job before is not what is being written now: a job
    // commits one round at a time, so it has at most one written checkpoint waiting.
    std::lock_guard<std::mutex> lock(write_mu_);
    std::erase_if(written_, [&](const auto& entry) { return entry.first == job_id; });
  }
  std::string header;
  RETURN_IF_ERROR(WriteFileAtomically(CheckpointPath(job_id, round), CheckpointPieces(global_model, extra, &header)));
  std::lock_guard<std::mutex> lock(write_mu_);
  written_.insert({job_id, round});
  return Status::Ok();
}

Status SqliteStateStore::CommitWrittenRound(const v1::Job& job, const v1::RoundRecord& record) {
  const std::string path = CheckpointPath(job.id(), record.round());
  std::lock_guard<std::mutex> lock(write_mu_);
  if (!written_.count({job.id(), record.round()})) {
    return NoWrittenCheckpointError(job.id(), record.round());
  }
  const std::string what = "commit round " + std::to_string(record.round()) + " of job " +
                           QuoteUntrusted(job.id(), kMaxJobIdBytes);
  RETURN_IF_ERROR(InTransactionLocked(what, [&]() -> Status {
    Statement st(writer_, "INSERT OR REPLACE INTO rounds (job_id, round, record, checkpoint) VALUES (?, ?, ?, ?)");
    if (!st.ok()) return SqliteError(writer_, "prepare insert round");
    RETURN_IF_ERROR(st.BindText(1, "job_id", job.id()));
    RETURN_IF_ERROR(st.BindInt(2, "round", record.round()));
    RETURN_IF_ERROR(st.BindBlob(3, "record", record.SerializeAsString()));
    RETURN_IF_ERROR(st.BindText(4, "checkpoint", path));
    if (st.Step() != SQLITE_DONE) return SqliteError(writer_, "insert round");
    return UpdateJobRowLocked(job);
  }));
  written_.erase({job.id(), record.round()});
  // Keep the initial model and the newest kKeptCheckpoints; a file left behind by a crash
  // here is removed at the next start (RemoveLeftoverCheckpoints).
  if (record.round() > kKeptCheckpoints) {
    std::error_code ec;
    std::filesystem::remove(CheckpointPath(job.id(), record.round() - kKeptCheckpoints), ec);
  }
  return Status::Ok();
}

Status SqliteStateStore::RewindJob(const v1::Job& job) {
  std::lock_guard<std::mutex> lock(write_mu_);
  const std::string what = "rewind job " + QuoteUntrusted(job.id(), kMaxJobIdBytes) + " to round " +
                           std::to_string(job.rounds_committed());
  return InTransactionLocked(what, [&]() -> Status {
    Statement st(writer_, "DELETE FROM rounds WHERE job_id = ? AND round > ?");
    if (!st.ok()) return SqliteError(writer_, "prepare delete rounds");
    RETURN_IF_ERROR(st.BindText(1, "job_id", job.id()));
    RETURN_IF_ERROR(st.BindInt(2, "round", job.rounds_committed()));
    if (st.Step() != SQLITE_DONE) return SqliteError(writer_, "delete rounds");
    return UpdateJobRowLocked(job);
  });
}

Result<std::vector<std::string>> SqliteStateStore::RemoveLeftoverCheckpoints() {
  // A job whose row cannot be read is not in the map: its files are kept.
  ASSIGN_OR_RETURN(JobList jobs, ListNewestJobs(SIZE_MAX));
  std::map<std::string, uint32_t> committed;
  for (const auto& job : jobs.jobs) committed[job.id()] = job.rounds_committed();
  std::vector<std::string> removed;
  std::error_code ec;
  // Stepped with an error code: a range-for's increment throws on a directory read that fails.
  for (std::filesystem::directory_iterator it(state_dir_ + "/checkpoints", ec), end; !ec && it != end; it.increment(ec)) {
    const std::filesystem::directory_entry& entry = *it;
    const std::string name = entry.path().filename().string();
    bool leftover = false;
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) {
      leftover = true;  // an atomic write that never reached its rename
    } else {
      const auto file = ParseCheckpointFileName(name);
      if (!file) continue;
      auto job = committed.find(file->job_id);
      if (job == committed.end()) continue;
      const uint64_t round = file->round, newest = job->second;
      leftover = round > newest || (round > 0 && round + kKeptCheckpoints <= newest);
    }
    if (!leftover) continue;
    std::error_code remove_error;
    if (std::filesystem::remove(entry.path(), remove_error)) {
      removed.push_back(entry.path().string());
    } else if (remove_error) {
      // Kept on disk, and said: the file stays until a start that can remove it. A file's
      // name is whatever was put in the directory: escaped and bounded, as any input.
      spdlog::warn("cannot remove leftover checkpoint file {} from {}: {}; it is tried again at the next start",
                   QuoteUntrusted(name, 128), QuoteUntrusted(state_dir_ + "/checkpoints", 256), remove_error.message());
    }
  }
  if (ec) return InternalError("cannot list " + QuoteUntrusted(state_dir_ + "/checkpoints") + ": " + ec.message());
  return removed;
}

Status SqliteStateStore::UpdateRoundRecord(const v1::Job& job, const v1::RoundRecord& record) {
  std::lock_guard<std::mutex> lock(write_mu_);
  // One transaction: the record and the job's row agree on the round's latency.
  const std::string what = "update the record of round " + std::to_string(record.round()) + " of job " +
                           QuoteUntrusted(job.id(), kMaxJobIdBytes);
  return InTransactionLocked(what, [&]() -> Status {
    Statement st(writer_, "UPDATE rounds SET record = ? WHERE job_id = ? AND round = ?");
    if (!st.ok()) return SqliteError(writer_, "prepare update round");
    RETURN_IF_ERROR(st.BindBlob(1, "record", record.SerializeAsString()));
    RETURN_IF_ERROR(st.BindText(2, "job_id", job.id()));
    RETURN_IF_ERROR(st.BindInt(3, "round", record.round()));
    if (st.Step() != SQLITE_DONE) return SqliteError(writer_, "update round");
    return UpdateJobRowLocked(job);
  });
}

Result<TensorSet> SqliteStateStore::LoadCheckpoint(const std::string& job_id, uint32_t round) {
  const std::string path = CheckpointPath(job_id, round);
  // Only a file that is not there is "missing": a read that fails for another reason (too
  // many open files, permissions, an I/O error) says nothing about the checkpoint, and must
  // not send a resume back to an older one. A FIFO in the file's place fails at once (the
  // open does not wait for a writer), and anything but a regular file is DataLoss, as a
  // damaged file is.
  struct stat info {};
  ASSIGN_OR_RETURN(const int fd, OpenRegularFileForReading(path, "checkpoint", &info));
  // Sized before a byte is read (or a buffer made): a file of terabytes, sparse, is as
  // damaged as a cut one.
  if (static_cast<uint64_t>(info.st_size) > kMaxCheckpointBytes) {
    ::close(fd);
    return DataLossError("checkpoint '" + path + "': " + std::to_string(info.st_size) + " bytes; expected at most " +
                         std::to_string(kMaxCheckpointBytes) + " (a job's model and state)");
  }
  std::string bytes;
  try {
    bytes.resize(static_cast<size_t>(info.st_size));
  } catch (const std::exception&) {
    ::close(fd);
    return ResourceExhaustedError("checkpoint '" + path + "': " + std::to_string(info.st_size) +
                                  " bytes do not fit in memory");
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return UnavailableError("cannot read checkpoint '" + path + "': " + std::strerror(err));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  bytes.resize(done);  // a file cut while it was read decodes as truncated
  return DecodeCheckpoint(bytes, path);
}

Result<std::vector<v1::RoundRecord>> SqliteStateStore::ListRounds(const std::string& job_id, uint32_t from_round,
                                                                   size_t max_bytes) {
  std::lock_guard<std::mutex> lock(read_mu_);
  Statement st(reader_, "SELECT record, round FROM rounds WHERE job_id = ? AND round >= ? ORDER BY round");
  if (!st.ok()) return SqliteError(reader_, "prepare list rounds");
  RETURN_IF_ERROR(st.BindText(1, "job_id", job_id));
  RETURN_IF_ERROR(st.BindInt(2, "round", from_round));
  std::vector<v1::RoundRecord> rounds;
  size_t bytes = 0;
  int rc = SQLITE_DONE;
  while (bytes <= max_bytes && (rc = st.Step()) == SQLITE_ROW) {
    const std::string blob = st.ColumnBlob(0);
    bytes += blob.size();
    // The round's type is asked before anything reads it: a read converts it.
    const int round_type = st.ColumnType(1);
    const int64_t round = round_type == SQLITE_INTEGER ? st.ColumnInt(1) : -1;
    const std::string where =
        "rounds table: job " + QuoteUntrusted(job_id, kMaxJobIdBytes) + ", round " + st.Shown(1, round_type);
    v1::RoundRecord record;
    if (!record.ParseFromString(blob)) return DataLossError(where + ": corrupt row");
    // Callers page on the records' rounds (the next page starts past the last one) and take
    // a record for the round its row is filed under: a record of another round, copied or
    // edited in by hand, is no record of this one.
    if (round_type != SQLITE_INTEGER || round != int64_t{record.round()}) {
      return DataLossError(where + ": field 'round': the record is of round " + std::to_string(record.round()) +
                           "; expected the row's own round");
    }
    rounds.push_back(std::move(record));
  }
  if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
    return SqliteError(reader_, "list rounds of " + QuoteUntrusted(job_id, kMaxJobIdBytes));
  }
  return rounds;
}

Status SqliteStateStore::SaveWorker(const v1::WorkerStatus& worker) {
  std::lock_guard<std::mutex> lock(write_mu_);
  Statement st(writer_, "INSERT OR REPLACE INTO workers (id, worker) VALUES (?, ?)");
  if (!st.ok()) return SqliteError(writer_, "prepare save worker");
  RETURN_IF_ERROR(st.BindText(1, "id", worker.worker_id()));
  RETURN_IF_ERROR(st.BindBlob(2, "worker", worker.SerializeAsString()));
  if (st.Step() != SQLITE_DONE) return SqliteError(writer_, "save worker " + QuoteUntrusted(worker.worker_id(), 128));
  return Status::Ok();
}

Result<std::string> SqliteStateStore::BindWorkerName(const std::string& name, const std::string& credential) {
  std::lock_guard<std::mutex> lock(write_mu_);
  std::string bound;
  // The binding is read back in the write's own transaction: the credential returned is the
  // one committed.
  RETURN_IF_ERROR(InTransactionLocked("bind worker name " + QuoteUntrusted(name, 128), [&]() -> Status {
    Statement insert(writer_, "INSERT OR IGNORE INTO worker_names (name, credential, bound_unix_ms) VALUES (?, ?, ?)");
    if (!insert.ok()) return SqliteError(writer_, "prepare bind worker name");
    RETURN_IF_ERROR(insert.BindText(1, "name", name));
    RETURN_IF_ERROR(insert.BindText(2, "credential", credential));
    RETURN_IF_ERROR(insert.BindInt(3, "bound_unix_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::system_clock::now().time_since_epoch()).count()));
    if (insert.Step() != SQLITE_DONE) return SqliteError(writer_, "bind worker name " + QuoteUntrusted(name, 128));
    Statement select(writer_, "SELECT credential FROM worker_names WHERE name = ?");
    if (!select.ok()) return SqliteError(writer_, "prepare read worker name");
    RETURN_IF_ERROR(select.BindText(1, "name", name));
    if (select.Step() != SQLITE_ROW) return SqliteError(writer_, "read worker name " + QuoteUntrusted(name, 128));
    bound = select.ColumnText(0);
    return Status::Ok();
  }));
  return bound;
}

Result<bool> SqliteStateStore::ForgetWorker(const std::string& name) {
  std::lock_guard<std::mutex> lock(write_mu_);
  bool forgot = false;
  // Both rows or neither: a binding left without its worker would hold the name for a
  // token the operator meant to release.
  RETURN_IF_ERROR(InTransactionLocked("forget worker " + QuoteUntrusted(name, 128), [&]() -> Status {
    for (const char* sql : {"DELETE FROM workers WHERE id = ?", "DELETE FROM worker_names WHERE name = ?"}) {
      Statement st(writer_, sql);
      if (!st.ok()) return SqliteError(writer_, "prepare forget worker");
      RETURN_IF_ERROR(st.BindText(1, "name", name));
      if (st.Step() != SQLITE_DONE) return SqliteError(writer_, "forget worker " + QuoteUntrusted(name, 128));
      forgot = forgot || sqlite3_changes(writer_) > 0;
    }
    return Status::Ok();
  }));
  return forgot;
}

Result<std::vector<v1::WorkerStatus>> SqliteStateStore::LoadWorkers() {
  std::lock_guard<std::mutex> lock(read_mu_);
  Statement st(reader_, "SELECT id, worker FROM workers ORDER BY id");
  if (!st.ok()) return SqliteError(reader_, "prepare load workers");
  std::vector<v1::WorkerStatus> workers;
  int rc;
  while ((rc = st.Step()) == SQLITE_ROW) {
    v1::WorkerStatus worker;
    if (!worker.ParseFromString(st.ColumnBlob(1))) {
      return DataLossError("workers table: worker " + QuoteUntrusted(st.ColumnText(0), 128) + ": corrupt row");
    }
    workers.push_back(std::move(worker));
  }
  if (rc != SQLITE_DONE) return SqliteError(reader_, "load workers");
  return workers;
}

Status SqliteStateStore::SaveSeat(const std::string& job_id, const std::string& worker_id, uint32_t party) {
  std::lock_guard<std::mutex> lock(write_mu_);
  Statement st(writer_, "INSERT OR REPLACE INTO seats (job_id, worker_id, party) VALUES (?, ?, ?)");
  if (!st.ok()) return SqliteError(writer_, "prepare save seat");
  RETURN_IF_ERROR(st.BindText(1, "job_id", job_id));
  RETURN_IF_ERROR(st.BindText(2, "worker_id", worker_id));
  RETURN_IF_ERROR(st.BindInt(3, "party", party));
  if (st.Step() != SQLITE_DONE) {
    return SqliteError(writer_, "save the seat of " + QuoteUntrusted(worker_id, 128) + " for job " +
                                    QuoteUntrusted(job_id, kMaxJobIdBytes));
  }
  return Status::Ok();
}

Result<std::vector<std::pair<std::string, uint32_t>>> SqliteStateStore::LoadSeats(const std::string& job_id,
                                                                                  size_t max_seats) {
  std::lock_guard<std::mutex> lock(read_mu_);
  // One row past the bound tells a job that holds too many from one that holds exactly it.
  Statement st(reader_, "SELECT worker_id, party FROM seats WHERE job_id = ? ORDER BY party, worker_id LIMIT ?");
  if (!st.ok()) return SqliteError(reader_, "prepare load seats");
  RETURN_IF_ERROR(st.BindText(1, "job_id", job_id));
  RETURN_IF_ERROR(
      st.BindInt(2, "limit", max_seats >= static_cast<size_t>(INT64_MAX) ? -1 : static_cast<int64_t>(max_seats) + 1));
  std::vector<std::pair<std::string, uint32_t>> seats;
  int rc;
  while ((rc = st.Step()) == SQLITE_ROW) {
    if (seats.size() == max_seats) return TooManySeatsError(job_id, max_seats);
    // The name's bytes as stored, a NUL among them too: the job checks them, and a name cut
    // at a NUL could pass for another worker's.
    std::string seat = st.ColumnBlob(0);
    // SQLite reads a party stored as text or a real as a number (0 for "abc"): only an
    // integer is a party. Its type is asked before the read converts it.
    const int type = st.ColumnType(1);
    const int64_t party = type == SQLITE_INTEGER ? st.ColumnInt(1) : -1;
    if (type != SQLITE_INTEGER || party < 0 || party > int64_t{UINT32_MAX}) {
      return DataLossError("seats table: job " + QuoteUntrusted(job_id, kMaxJobIdBytes) + ", seat " +
                           QuoteUntrusted(seat, 128) + ": party " + st.Shown(1, type) +
                           ": expected a number from 0 to " + std::to_string(UINT32_MAX));
    }
    seats.emplace_back(std::move(seat), static_cast<uint32_t>(party));
  }
  if (rc != SQLITE_DONE) return SqliteError(reader_, "load seats of " + QuoteUntrusted(job_id, kMaxJobIdBytes));
  return seats;
}

}  // namespace tessera::server
