// SQLite's C API as the state store uses it: prepared statements that finalise themselves
// and check every bind, and errors that name what failed. Internal to server/state/.
#pragma once

#include <sqlite3.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "base/escape.h"
#include "base/status.h"

namespace tessera::server::sqlite {

// `message` as the status SQLite's result code `rc` calls for: a lock another connection
// held past the busy timeout is Unavailable (tried again later, the call may pass), a full
// disk ResourceExhausted, a damaged database file DataLoss, anything else Internal.
inline Status SqliteStatus(int rc, std::string message) {
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED: return UnavailableError(std::move(message) + " (another connection holds the database's lock)");
    case SQLITE_FULL: return ResourceExhaustedError(std::move(message) + " (the disk is full)");
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB: return DataLossError(std::move(message));
    default: return InternalError(std::move(message));
  }
}

inline Status SqliteError(sqlite3* db, const std::string& what) {
  return SqliteStatus(sqlite3_extended_errcode(db), "SQLite: " + what + ": " + sqlite3_errmsg(db));
}

// A prepared statement that finalises itself.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) : db_(db) {
    if (sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr) != SQLITE_OK) stmt_ = nullptr;
  }
  Statement(sqlite3* db, const std::string& sql) : Statement(db, sql.c_str()) {}
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  bool ok() const { return stmt_ != nullptr; }
  // Each bind says whether it took: a parameter left unbound is NULL, and a statement run
  // with one would write NULL or match no row, without an error. Text and blobs longer
  // than the connection's length limit (at most INT_MAX, the length a bind takes) are
  // refused naming the statement and the parameter `name`, never cut by a cast.
  Status BindText(int i, const char* name, std::string_view s) {
    RETURN_IF_ERROR(CheckLength(i, name, s.size()));
    return Bound(i, name, sqlite3_bind_text(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT));
  }
  Status BindBlob(int i, const char* name, std::string_view s) {
    RETURN_IF_ERROR(CheckLength(i, name, s.size()));
    return Bound(i, name, sqlite3_bind_blob(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT));
  }
  Status BindInt(int i, const char* name, int64_t v) { return Bound(i, name, sqlite3_bind_int64(stmt_, i, v)); }
  int Step() { return sqlite3_step(stmt_); }
  std::string ColumnBlob(int i) {
    const void* p = sqlite3_column_blob(stmt_, i);
    return std::string(static_cast<const char*>(p), static_cast<size_t>(sqlite3_column_bytes(stmt_, i)));
  }
  std::string ColumnText(int i) {
    const unsigned char* p = sqlite3_column_text(stmt_, i);
    return p ? std::string(reinterpret_cast<const char*>(p)) : std::string();
  }
  int64_t ColumnInt(int i) { return sqlite3_column_int64(stmt_, i); }
  // SQLITE_INTEGER, ...: meaningful only before a read converts the value (sqlite3_column_text
  // of a number, say), so it is asked first.
  int ColumnType(int i) { return sqlite3_column_type(stmt_, i); }
  // Column `i`, of `type` (ColumnType, asked before any read), as an error shows it: NULL,
  // or the value quoted, escaped and bounded; text and blobs as stored, a NUL among them too.
  std::string Shown(int i, int type) {
    switch (type) {
      case SQLITE_NULL: return "NULL";
      case SQLITE_INTEGER: return "'" + std::to_string(ColumnInt(i)) + "'";
      case SQLITE_FLOAT: return QuoteUntrusted(ColumnText(i), 32);
      default: return QuoteUntrusted(ColumnBlob(i), 32);
    }
  }

 private:
  std::string Where(int i, const char* name) const {
    const char* sql = sqlite3_sql(stmt_);
    return "SQLite: statement '" + std::string(sql ? sql : "").substr(0, 80) + "', parameter " + std::to_string(i) +
           " (" + name + ")";
  }
  Status CheckLength(int i, const char* name, size_t size) const {
    const int limit = sqlite3_limit(db_, SQLITE_LIMIT_LENGTH, -1);
    const size_t max = std::min<size_t>(INT_MAX, limit < 0 ? 0 : static_cast<size_t>(limit));
    if (size <= max) return Status::Ok();
    return InvalidArgumentError(Where(i, name) + ": " + std::to_string(size) + " bytes; expected at most " +
                                std::to_string(max) + " (the database's length limit)");
  }
  Status Bound(int i, const char* name, int rc) const {
    if (rc == SQLITE_OK) return Status::Ok();
    return InternalError(Where(i, name) + ": cannot bind: " + sqlite3_errstr(rc));
  }

  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
};

// Runs `sql` (statements that return no rows) on `db`.
inline Status Exec(sqlite3* db, const std::string& sql) {
  char* error = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  if (rc != SQLITE_OK) {
    std::string message = error ? error : sqlite3_errstr(rc);
    sqlite3_free(error);
    return SqliteStatus(rc, "SQLite: " + message + " (in: " + sql.substr(0, 60) + ")");
  }
  return Status::Ok();
}

// The text in the first column of the first row `sql` gives on `db`.
inline Result<std::string> QueryText(sqlite3* db, const char* sql) {
  Statement st(db, sql);
  if (!st.ok()) return SqliteError(db, std::string("prepare ") + sql);
  if (st.Step() != SQLITE_ROW) return SqliteError(db, sql);
  return st.ColumnText(0);
}

}  // namespace tessera::server::sqlite
