// The SQLite store against rows it did not write and values it cannot write: a value edited
// in by hand is shown as stored, before anything reads it as another type; a job number
// that has no successor is refused naming the file and the column; a value past the
// database's length limit is refused naming the statement and the parameter, never cut or
// bound as NULL. (The store's other behaviour: sqlite_state_store_test.cc.)
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "server/state/sqlite_state_store.h"
#include "server/state/sqlite_statement.h"
#include "tests/server/edit_database.h"
#include "tests/server/test_directory.h"

namespace tessera::server {
namespace {

class SqliteStateStoreRowsTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = FreshTestDirectory("tessera-state-rows"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Runs `sql` on the store's database, as a hand edit would, with the store closed.
  void EditDatabase(const char* sql) { ::tessera::server::EditDatabase(dir_, sql); }

  std::filesystem::path dir_;
};

v1::Job NewJob(const std::string& id) {
  v1::Job job;
  job.set_id(id);
  job.set_state(v1::JOB_PENDING);
  return job;
}

TEST_F(SqliteStateStoreRowsTest, ARoundStoredAsABlobIsShownAsStoredNotAsTextCutAtItsNul) {
  v1::Job job = NewJob("job-1-abc");
  {
    auto store = SqliteStateStore::Open(dir_.string());
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->InsertJob(job).ok());
    ASSERT_TRUE((*store)->SaveInitialModel(job.id(), {{"w", {1}, {1.0f}}}).ok());
    v1::RoundRecord record;
    record.set_round(1);
    job.set_rounds_committed(1);
    ASSERT_TRUE((*store)->CommitRound(job, record, {{"w", {1}, {2.0f}}}).ok());
  }
  // Read as text, the blob is "1": the round of its record.
  EditDatabase("UPDATE rounds SET round = X'3100FF' WHERE job_id = 'job-1-abc' AND round = 1");
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok());
  auto rounds = (*store)->ListRounds("job-1-abc");
  ASSERT_FALSE(rounds.ok()) << "listed " << rounds->size() << " rounds";
  EXPECT_EQ(rounds.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(rounds.status().message(),
            "rounds table: job 'job-1-abc', round '1\\x00\\xff': field 'round': the record is of round 1; expected "
            "the row's own round");
}

TEST_F(SqliteStateStoreRowsTest, APartyStoredAsABlobOrNullIsShownAsStored) {
  { ASSERT_TRUE(SqliteStateStore::Open(dir_.string()).ok()); }
  EditDatabase("INSERT INTO seats (job_id, worker_id, party) VALUES ('job-1-abc', 'w1', X'3100')");
  {
    auto store = SqliteStateStore::Open(dir_.string());
    ASSERT_TRUE(store.ok());
    auto seats = (*store)->LoadSeats("job-1-abc");
    ASSERT_FALSE(seats.ok());
    EXPECT_EQ(seats.status().code(), StatusCode::kDataLoss);
    EXPECT_EQ(seats.status().message(),
              "seats table: job 'job-1-abc', seat 'w1': party '1\\x00': expected a number from 0 to 4294967295");
  }
  // The column is NOT NULL; a table made without the constraint can still hold one.
  EditDatabase("DROP TABLE seats; CREATE TABLE seats (job_id TEXT, worker_id TEXT, party INTEGER);"
               "INSERT INTO seats VALUES ('job-1-abc', 'w1', NULL)");
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok());
  auto seats = (*store)->LoadSeats("job-1-abc");
  ASSERT_FALSE(seats.ok());
  EXPECT_EQ(seats.status().message(),
            "seats table: job 'job-1-abc', seat 'w1': party NULL: expected a number from 0 to 4294967295");
}

TEST_F(SqliteStateStoreRowsTest, AJobNumberWithNoSuccessorIsRefusedNamingTheFileAndTheColumn) {
  {
    auto store = SqliteStateStore::Open(dir_.string());
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->InsertJob(NewJob("job-1-abc")).ok());
    auto next = (*store)->NextJobNumber();
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    EXPECT_EQ(*next, 2u);
  }
  // MAX(number) + 1 past INT64_MAX is a real in SQLite, and every later job would read the
  // same number back.
  EditDatabase("UPDATE jobs SET number = 9223372036854775807 WHERE id = 'job-1-abc'");
  const std::string expected = "'" + (dir_ / "coordinator.db").string() +
                               "': jobs table, column 'number': the largest is '9223372036854775807'; expected a "
                               "number from 0 to 9223372036854775806, so that the next job's number fits";
  {
    auto store = SqliteStateStore::Open(dir_.string());
    ASSERT_TRUE(store.ok());
    auto next = (*store)->NextJobNumber();
    ASSERT_FALSE(next.ok()) << "next job number " << *next;
    EXPECT_EQ(next.status().code(), StatusCode::kDataLoss);
    EXPECT_EQ(next.status().message(), expected);
    const Status inserted = (*store)->InsertJob(NewJob("job-2-abc"));
    EXPECT_EQ(inserted.code(), StatusCode::kDataLoss);
    EXPECT_EQ(inserted.message(), "insert job 'job-2-abc': " + expected);
    EXPECT_EQ((*store)->GetJob("job-2-abc").status().code(), StatusCode::kNotFound);
  }
  // Text ranks above every number in SQLite: MAX would be it, and the next number 1 again.
  EditDatabase("UPDATE jobs SET number = 'seven' WHERE id = 'job-1-abc'");
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok());
  auto next = (*store)->NextJobNumber();
  ASSERT_FALSE(next.ok()) << "next job number " << *next;
  EXPECT_EQ(next.status().message(), "'" + (dir_ / "coordinator.db").string() +
                                         "': jobs table, column 'number': the largest is 'seven'; expected a "
                                         "number from 0 to 9223372036854775806, so that the next job's number fits");
}

// Every connection opened while it lives has a length limit of `kLimit` bytes.
constexpr int kLimit = 2000;
class SmallLengthLimit {
 public:
  SmallLengthLimit() { sqlite3_auto_extension(reinterpret_cast<void (*)()>(&Apply)); }
  ~SmallLengthLimit() { sqlite3_cancel_auto_extension(reinterpret_cast<void (*)()>(&Apply)); }

 private:
  static int Apply(sqlite3* db, char**, const sqlite3_api_routines*) {
    sqlite3_limit(db, SQLITE_LIMIT_LENGTH, kLimit);
    return SQLITE_OK;
  }
};

TEST_F(SqliteStateStoreRowsTest, AValuePastTheLengthLimitIsRefusedNamingTheStatementAndTheParameter) {
  SmallLengthLimit limit;
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  v1::Job job = NewJob("job-1-abc");
  ASSERT_TRUE((*store)->InsertJob(job).ok());
  // Unchecked, the refused bind left the row's blob NULL: a constraint's error, or, for a
  // key, an update that matched no row and said nothing.
  job.set_error(std::string(3000, 'x'));
  const size_t size = JobRow(job).SerializeAsString().size();
  const Status updated = (*store)->UpdateJob(job);
  EXPECT_EQ(updated.code(), StatusCode::kInvalidArgument);
  // The statement as the error shows it: its first 80 characters.
  EXPECT_EQ(updated.message(), "SQLite: statement 'UPDATE jobs SET job = ?, ended_unix_ms = CASE WHEN ? THEN "
                               "COALESCE(ended_unix_ms', parameter 1 (job): " +
                                   std::to_string(size) + " bytes; expected at most 2000 (the database's length limit)");
  auto read = (*store)->GetJob("job-1-abc");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->error(), "");
  // A key past the limit is refused too, not bound as NULL.
  const Status seat = (*store)->SaveSeat("job-1-abc", std::string(kLimit + 1, 'w'), 0);
  EXPECT_EQ(seat.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(seat.message(),
            "SQLite: statement 'INSERT OR REPLACE INTO seats (job_id, worker_id, party) VALUES (?, ?, ?)', parameter 2 "
            "(worker_id): 2001 bytes; expected at most 2000 (the database's length limit)");
}

TEST(SqliteStatementTest, ABindPastTheLimitOrOfNoParameterIsAnError) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(":memory:", &db), SQLITE_OK);
  sqlite3_limit(db, SQLITE_LIMIT_LENGTH, 10);
  {
    sqlite::Statement st(db, "SELECT ?");
    ASSERT_TRUE(st.ok());
    EXPECT_TRUE(st.BindBlob(1, "value", std::string(10, 'x')).ok());
    const Status text = st.BindText(1, "value", std::string(11, 'x'));
    EXPECT_EQ(text.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(text.message(),
              "SQLite: statement 'SELECT ?', parameter 1 (value): 11 bytes; expected at most 10 (the database's length "
              "limit)");
    const Status range = st.BindInt(2, "other", 1);
    EXPECT_EQ(range.code(), StatusCode::kInternal);
    EXPECT_EQ(range.message(), "SQLite: statement 'SELECT ?', parameter 2 (other): cannot bind: column index out of range");
  }
  sqlite3_close(db);
}

}  // namespace
}  // namespace tessera::server
