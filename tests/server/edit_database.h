// Runs SQL on a coordinator's state database, as a hand edit would, with the store closed:
// for tests of the SQLite store against rows it did not write.
#pragma once

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <filesystem>

namespace tessera::server {

inline void EditDatabase(const std::filesystem::path& state_dir, const char* sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((state_dir / "coordinator.db").c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, &error);
  EXPECT_EQ(rc, SQLITE_OK) << (error ? error : "");
  sqlite3_free(error);
  sqlite3_close(db);
}

}  // namespace tessera::server
