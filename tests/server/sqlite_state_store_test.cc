// The SQLite store's own side: jobs, committed rounds and checkpoints survive a reopen;
// unwritable paths are named (corrupt checkpoint files: checkpoint_file_test.cc); seats edited by hand are read
// only as far as they can be trusted; files an interrupted coordinator left are removed, or
// named in a warning when they cannot be; reads do not wait for a write, and see it once it
// returned. What every store does is in
// state_store_conformance_test.cc.
#include "server/state/sqlite_state_store.h"
#include "tests/captured_log.h"
#include "tests/server/edit_database.h"
#include "tests/server/test_directory.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

namespace tessera::server {
namespace {

class SqliteStateStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDirectory("tessera-state");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TensorSet Model(float v) { return {{"w", {2, 2}, {v, v + 1, v + 2, v + 3}}, {"b", {2}, {v, -v}}}; }

TEST_F(SqliteStateStoreTest, CommittedRoundsAndCheckpointsSurviveAReopen) {
  v1::Job job;
  job.set_id("job-1-abc");
  job.mutable_spec()->set_rounds(5);
  job.set_state(v1::JOB_RUNNING);
  {
    auto store = SqliteStateStore::Open(dir_.string());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    ASSERT_TRUE((*store)->InsertJob(job).ok());
    ASSERT_TRUE((*store)->SaveInitialModel(job.id(), Model(0)).ok());
    for (uint32_t r = 1; r <= 3; ++r) {
      v1::RoundRecord record;
      record.set_round(r);
      record.set_test_accuracy(0.1 * r);
      job.set_rounds_committed(r);
      ASSERT_TRUE((*store)->CommitRound(job, record, Model(static_cast<float>(r))).ok());
    }
    ASSERT_TRUE((*store)->SaveSeat(job.id(), "w1", 4).ok());
  }
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok());
  auto loaded = (*store)->GetJob(job.id());
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->rounds_committed(), 3u);
  auto rounds = (*store)->ListRounds(job.id());
  ASSERT_TRUE(rounds.ok());
  ASSERT_EQ(rounds->size(), 3u);
  EXPECT_DOUBLE_EQ((*rounds)[2].test_accuracy(), 0.1 * 3);
  auto checkpoint = (*store)->LoadCheckpoint(job.id(), 3);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  EXPECT_EQ((*checkpoint)[0].values, Model(3)[0].values);
  EXPECT_TRUE((*store)->LoadCheckpoint(job.id(), 0).ok());  // the initial model is kept
  auto seats = (*store)->LoadSeats(job.id());
  ASSERT_TRUE(seats.ok());
  ASSERT_EQ(seats->size(), 1u);
  EXPECT_EQ((*seats)[0].second, 4u);
  EXPECT_EQ((*store)->NextJobNumber().value(), 2u);
}

TEST_F(SqliteStateStoreTest, AnUnwritablePathIsNamedAndTheOldFileStays) {
  std::filesystem::create_directories(dir_);
  const std::string path = (dir_ / "file").string();
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  Status s = WriteFileAtomically((dir_ / "missing" / "file").string(), "new");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("missing/file"), std::string::npos) << s.message();
  std::ifstream in(path);
  std::string content;
  in >> content;
  EXPECT_EQ(content, "old");
}

// Commits rounds 1..`rounds` of job-1-abc (checkpoint i holds Model(i)).
void CommitRounds(StateStore& store, v1::Job* job, uint32_t rounds) {
  ASSERT_TRUE(store.SaveInitialModel(job->id(), Model(0)).ok());
  for (uint32_t r = 1; r <= rounds; ++r) {
    v1::RoundRecord record;
    record.set_round(r);
    job->set_rounds_committed(r);
    ASSERT_TRUE(store.CommitRound(*job, record, Model(static_cast<float>(r))).ok());
  }
}

v1::Job RunningJob() {
  v1::Job job;
  job.set_id("job-1-abc");
  job.set_state(v1::JOB_RUNNING);
  return job;
}

TEST_F(SqliteStateStoreTest, TheNewestCheckpointsAreKeptAndADamagedOneFallsBackNamingTheFile) {
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok());
  v1::Job job = RunningJob();
  ASSERT_TRUE((*store)->InsertJob(job).ok());
  CommitRounds(**store, &job, 5);
  const auto checkpoints = dir_ / "checkpoints";
  for (uint32_t r : {0u, 3u, 4u, 5u}) {
    EXPECT_TRUE(std::filesystem::exists(checkpoints / ("job-1-abc-round-" + std::to_string(r) + ".ckpt"))) << r;
  }
  for (uint32_t r : {1u, 2u}) {
    EXPECT_FALSE(std::filesystem::exists(checkpoints / ("job-1-abc-round-" + std::to_string(r) + ".ckpt"))) << r;
  }
  // Round 5's file is damaged, round 4's missing: round 3 it is, and both are named.
  std::ofstream(checkpoints / "job-1-abc-round-5.ckpt", std::ios::trunc) << "TSRCKPT1 but nothing after";
  std::filesystem::remove(checkpoints / "job-1-abc-round-4.ckpt");
  std::vector<Status> damaged;
  auto newest = (*store)->LoadNewestCheckpoint(job.id(), 5, &damaged);
  ASSERT_TRUE(newest.ok()) << newest.status().ToString();
  EXPECT_EQ(newest->round, 3u);
  EXPECT_EQ(newest->tensors[0].values, Model(3)[0].values);
  ASSERT_EQ(damaged.size(), 2u);
  EXPECT_NE(damaged[0].message().find("job-1-abc-round-5.ckpt"), std::string::npos) << damaged[0].message();
  EXPECT_NE(damaged[1].message().find("job-1-abc-round-4.ckpt"), std::string::npos) << damaged[1].message();
  // Rewinding to round 3 forgets the records of rounds 4 and 5.
  job.set_rounds_committed(3);
  ASSERT_TRUE((*store)->RewindJob(job).ok());
  EXPECT_EQ((*store)->GetJob(job.id())->rounds_committed(), 3u);
  EXPECT_EQ((*store)->ListRounds(job.id())->size(), 3u);
}

TEST_F(SqliteStateStoreTest, ACheckpointThatCannotBeReadForAnotherReasonDoesNotSendTheJobBack) {
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok());
  v1::Job job = RunningJob();
  ASSERT_TRUE((*store)->InsertJob(job).ok());
  CommitRounds(**store, &job, 5);
  // Round 5's name now leads nowhere it can be opened (a link to itself): not missing, not
  // damaged, just unreadable for now.
  const auto newest_file = dir_ / "checkpoints" / "job-1-abc-round-5.ckpt";
  std::filesystem::remove(newest_file);
  std::filesystem::create_symlink(newest_file, newest_file);
  auto loaded = (*store)->LoadCheckpoint(job.id(), 5);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kUnavailable) << loaded.status().ToString();
  EXPECT_NE(loaded.status().message().find("job-1-abc-round-5.ckpt"), std::string::npos);
  std::vector<Status> damaged;
  auto newest = (*store)->LoadNewestCheckpoint(job.id(), 5, &damaged);
  ASSERT_FALSE(newest.ok()) << "round 4's checkpoint is not taken instead";
  EXPECT_EQ(newest.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(damaged.empty());
}

// A commit that finds the database's lock held by another connection past the busy timeout
// is Unavailable (a later try may pass), naming the job and the round; it changes nothing,
// and the written checkpoint is committed once the lock is let go.
TEST_F(SqliteStateStoreTest, ACommitThatFindsTheDatabaseLockedIsUnavailableNamingTheJob) {
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok());
  v1::Job job = RunningJob();
  ASSERT_TRUE((*store)->InsertJob(job).ok());
  ASSERT_TRUE((*store)->SaveInitialModel(job.id(), Model(0)).ok());
  ASSERT_TRUE((*store)->WriteCheckpoint(job.id(), 1, Model(1)).ok());
  v1::RoundRecord record;
  record.set_round(1);
  job.set_rounds_committed(1);
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open((dir_ / "coordinator.db").c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  Status locked = (*store)->CommitWrittenRound(job, record);
  EXPECT_EQ(locked.code(), StatusCode::kUnavailable) << locked.ToString();
  EXPECT_NE(locked.message().find("commit round 1 of job 'job-1-abc'"), std::string::npos) << locked.message();
  EXPECT_EQ((*store)->GetJob(job.id())->rounds_committed(), 0u);
  EXPECT_EQ(sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);
  Status committed = (*store)->CommitWrittenRound(job, record);
  EXPECT_TRUE(committed.ok()) << committed.ToString();
  EXPECT_EQ((*store)->GetJob(job.id())->rounds_committed(), 1u);
}

// A database file that is no SQLite database (overwritten, or another file put in its place)
// is DataLoss naming it, from the first statement the open runs.
TEST_F(SqliteStateStoreTest, ADatabaseFileThatIsNoDatabaseIsDataLossNamingIt) {
  std::filesystem::create_directories(dir_);
  const auto db = dir_ / "coordinator.db";
  std::ofstream(db, std::ios::binary) << std::string(8192, '\xa5');
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kDataLoss) << store.status().ToString();
  EXPECT_NE(store.status().message().find(db.string()), std::string::npos) << store.status().message();
}

TEST_F(SqliteStateStoreTest, ADamagedTableIsAnErrorNotAShorterList) {
  {
    auto store = SqliteStateStore::Open(dir_.string());
    ASSERT_TRUE(store.ok());
    for (int i = 0; i < 200; ++i) {
      v1::Job job = RunningJob();
      job.set_id("job-" + std::to_string(i) + "-abc");
      job.set_error(std::string(2000, 'x'));  // rows over many pages
      ASSERT_TRUE((*store)->InsertJob(job).ok());
    }
  }
  // Closing wrote the log into the database file; pages past the first few are overwritten.
  const auto db = dir_ / "coordinator.db";
  ASSERT_GT(std::filesystem::file_size(db), 40u * 4096);
  {
    std::fstream file(db, std::ios::in | std::ios::out | std::ios::binary);
    const std::string garbage(4096 * 4, '\xa5');
    file.seekp(4096 * 30);
    file.write(garbage.data(), static_cast<std::streamsize>(garbage.size()));
  }
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto jobs = (*store)->ListJobs();
  ASSERT_FALSE(jobs.ok()) << "listed " << jobs->size() << " of 200 jobs as if that were all";
  EXPECT_NE(jobs.status().message().find("list jobs"), std::string::npos) << jobs.status().ToString();
}

TEST_F(SqliteStateStoreTest, ARowThatDoesNotParseIsNamedAndHidesNoOtherJob) {
  {
    auto store = SqliteStateStore::Open(dir_.string());
    ASSERT_TRUE(store.ok());
    for (const char* id : {"job-1-abc", "job-2-abc", "job-3-abc"}) {
      v1::Job job = RunningJob();
      job.set_id(id);
      ASSERT_TRUE((*store)->InsertJob(job).ok());
    }
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir_ / "coordinator.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE jobs SET job = X'FFFFFFFF0A' WHERE id = 'job-2-abc'", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok());
  auto strict = (*store)->ListJobs();
  ASSERT_FALSE(strict.ok());
  EXPECT_EQ(strict.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(strict.status().message().find("'job-2-abc': corrupt row"), std::string::npos) << strict.status().ToString();
  auto listed = (*store)->ListNewestJobs(SIZE_MAX);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->jobs.size(), 2u);
  EXPECT_EQ(listed->jobs[0].id(), "job-1-abc");
  EXPECT_EQ(listed->jobs[1].id(), "job-3-abc");
  EXPECT_EQ(listed->total, 3u);
  EXPECT_EQ(listed->damaged, std::vector<std::string>{"job-2-abc"});
  // Its files are not taken for leftovers.
  std::ofstream(dir_ / "checkpoints" / "job-2-abc-round-7.ckpt") << "kept";
  auto removed = (*store)->RemoveLeftoverCheckpoints();
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_TRUE(std::filesystem::exists(dir_ / "checkpoints" / "job-2-abc-round-7.ckpt"));
}

TEST_F(SqliteStateStoreTest, ASeatWhosePartyIsNotANumberIsDataLossNamingIt) {
  {
    auto store = SqliteStateStore::Open(dir_.string());
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->SaveSeat("job-1-abc", "w1", 1).ok());
  }
  // SQLite keeps text in an INTEGER column, and reads it as the number 0: w2 would pass
  // for the seat of party 0.
  EditDatabase(dir_, "INSERT INTO seats (job_id, worker_id, party) VALUES ('job-1-abc', 'w2', 'abc')");
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok());
  auto seats = (*store)->LoadSeats("job-1-abc");
  ASSERT_FALSE(seats.ok()) << "w2 read as party " << seats->front().second;
  EXPECT_EQ(seats.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(seats.status().message(),
            "seats table: job 'job-1-abc', seat 'w2': party 'abc': expected a number from 0 to 4294967295");
}

TEST_F(SqliteStateStoreTest, AJobWithMoreSeatsThanAnyJobHoldsIsReadOnlyPastTheBound) {
  { ASSERT_TRUE(SqliteStateStore::Open(dir_.string()).ok()); }
  // One more row than kMaxStoredSeats, written in one statement.
  EditDatabase(dir_,
               "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 100000) "
               "INSERT INTO seats (job_id, worker_id, party) SELECT 'job-1-abc', 'w' || i, i FROM n");
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok());
  auto seats = (*store)->LoadSeats("job-1-abc");
  ASSERT_FALSE(seats.ok()) << "read all " << seats->size() << " seats";
  EXPECT_EQ(seats.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(seats.status().message(),
            "seats table: job 'job-1-abc': more than 100000 seats stored; expected at most 100000");
}

TEST_F(SqliteStateStoreTest, AJobRowThatHoldsAnotherJobOrIsNoJobIdIsNotRead) {
  {
    auto store = SqliteStateStore::Open(dir_.string());
    ASSERT_TRUE(store.ok());
    for (const char* id : {"job-1-abc", "../../escaped"}) {
      v1::Job job = RunningJob();
      job.set_id(id);
      ASSERT_TRUE((*store)->InsertJob(job).ok());
    }
  }
  // A copy of job-1-abc's row under another key: resumed, it would run job-1-abc twice.
  EditDatabase(dir_, "INSERT INTO jobs (id, number, job) SELECT 'job-3-abc', 3, job FROM jobs WHERE id = 'job-1-abc'");
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok());
  auto copied = (*store)->GetJob("job-3-abc");
  ASSERT_FALSE(copied.ok()) << "read as job " << copied->id();
  EXPECT_EQ(copied.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(copied.status().message(),
            "jobs table: job 'job-3-abc': field 'id': the row holds job 'job-1-abc'; expected the row's own id");
  // A key that is no job id: the runner would make its checkpoints' paths from it.
  auto escaped = (*store)->GetJob("../../escaped");
  ASSERT_FALSE(escaped.ok());
  EXPECT_EQ(escaped.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(escaped.status().message().find("jobs table: job '../../escaped': field 'id': expected 1 to 64"),
            std::string::npos)
      << escaped.status().ToString();
  auto listed = (*store)->ListNewestJobs(SIZE_MAX);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->jobs.size(), 1u);
  EXPECT_EQ(listed->jobs[0].id(), "job-1-abc");
  EXPECT_EQ(listed->total, 3u);
  EXPECT_EQ(listed->damaged, (std::vector<std::string>{"../../escaped", "job-3-abc"}));
}

TEST_F(SqliteStateStoreTest, ARoundRecordFiledUnderAnotherRoundIsDataLossNamingIt) {
  v1::Job job = RunningJob();
  {
    auto store = SqliteStateStore::Open(dir_.string());
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->InsertJob(job).ok());
    CommitRounds(**store, &job, 3);
  }
  // Round 3's record under round 2 too: a reader paging on the records' rounds would read
  // round 3 twice, and one filed under a round of 2^32 - 1 would send it back to round 0.
  EditDatabase(dir_,
               "UPDATE rounds SET record = (SELECT record FROM rounds WHERE job_id = 'job-1-abc' AND round = 3) "
               "WHERE job_id = 'job-1-abc' AND round = 2");
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok());
  auto rounds = (*store)->ListRounds("job-1-abc");
  ASSERT_FALSE(rounds.ok()) << "listed " << rounds->size() << " rounds";
  EXPECT_EQ(rounds.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(rounds.status().message(),
            "rounds table: job 'job-1-abc', round '2': field 'round': the record is of round 3; expected the row's "
            "own round");
  // The rounds before it are still read.
  auto first = (*store)->ListRounds("job-1-abc", 0, /*max_bytes=*/0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(first->size(), 1u);
  EXPECT_EQ(first->front().round(), 1u);
}

TEST_F(SqliteStateStoreTest, LeftoverCheckpointFilesAreRemovedAtStart) {
  v1::Job job = RunningJob();
  {
    auto store = SqliteStateStore::Open(dir_.string());
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->InsertJob(job).ok());
    CommitRounds(**store, &job, 5);
  }
  const auto checkpoints = dir_ / "checkpoints";
  // What a coordinator killed at the wrong moments leaves: the checkpoint a commit superseded
  // (round 1), a checkpoint written but never committed (round 6), a write cut short, and a
  // file of a job the database does not know (left alone).
  for (const char* name : {"job-1-abc-round-1.ckpt", "job-1-abc-round-6.ckpt", "job-1-abc-round-6.ckpt.tmp",
                           "job-9-zzz-round-1.ckpt"}) {
    std::ofstream(checkpoints / name) << "leftover";
  }
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok());
  auto removed = (*store)->RemoveLeftoverCheckpoints();
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_EQ(removed->size(), 3u);
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(checkpoints)) left.push_back(entry.path().filename());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"job-1-abc-round-0.ckpt", "job-1-abc-round-3.ckpt", "job-1-abc-round-4.ckpt",
                                            "job-1-abc-round-5.ckpt", "job-9-zzz-round-1.ckpt"}));
}

TEST_F(SqliteStateStoreTest, ALeftoverThatCannotBeRemovedIsLoggedNamingItAndTheOthersGo) {
  v1::Job job = RunningJob();
  {
    auto store = SqliteStateStore::Open(dir_.string());
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->InsertJob(job).ok());
    CommitRounds(**store, &job, 5);
  }
  const auto checkpoints = dir_ / "checkpoints";
  // At a never-committed round's name, something that cannot be removed: a directory that is
  // not empty (as a file in a directory the coordinator may not write to would be).
  std::filesystem::create_directory(checkpoints / "job-1-abc-round-7.ckpt");
  std::ofstream(checkpoints / "job-1-abc-round-7.ckpt" / "inside") << "kept";
  std::ofstream(checkpoints / "job-1-abc-round-6.ckpt") << "leftover";
  tessera::testing::CapturedLog log;
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok());
  auto removed = (*store)->RemoveLeftoverCheckpoints();
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  ASSERT_EQ(removed->size(), 1u);
  EXPECT_EQ(std::filesystem::path((*removed)[0]).filename(), "job-1-abc-round-6.ckpt");
  EXPECT_TRUE(std::filesystem::exists(checkpoints / "job-1-abc-round-7.ckpt"));
  const std::string text = log.text();
  EXPECT_NE(text.find("cannot remove leftover checkpoint file 'job-1-abc-round-7.ckpt' from '" +
                      checkpoints.string() + "': "),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("; it is tried again at the next start"), std::string::npos) << text;
}

// A VFS over SQLite's default one, made the default while it lives, so that the connections
// opened meanwhile (the store's too) go through it. It notes which threads sleep in SQLite
// (its busy handler sleeps there while another connection holds the lock it waits for), and
// can open the database the way the system does a file the process may only read, or refuse
// to open it read-only.
class WatchingVfs {
 public:
  enum class MainDatabase { kAsAsked, kReadOnlyToTheProcess, kNoReadOnlyOpen };

  WatchingVfs() : base_(sqlite3_vfs_find(nullptr)) {
    vfs_.iVersion = 2;
    vfs_.szOsFile = base_->szOsFile;
    vfs_.mxPathname = base_->mxPathname;
    vfs_.zName = "tessera-test-watching";
    vfs_.pAppData = this;
    vfs_.xOpen = [](sqlite3_vfs* vfs, sqlite3_filename name, sqlite3_file* file, int flags, int* out_flags) {
      WatchingVfs* self = Self(vfs);
      if ((flags & SQLITE_OPEN_MAIN_DB) != 0) {
        if (self->main_ == MainDatabase::kNoReadOnlyOpen && (flags & SQLITE_OPEN_READONLY) != 0) {
          file->pMethods = nullptr;
          return SQLITE_CANTOPEN;
        }
        // What SQLite does when the system refuses to open the file for writing.
        if (self->main_ == MainDatabase::kReadOnlyToTheProcess) {
          flags = (flags & ~(SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE)) | SQLITE_OPEN_READONLY;
        }
      }
      return self->base_->xOpen(self->base_, name, file, flags, out_flags);
    };
    vfs_.xDelete = [](sqlite3_vfs* vfs, const char* name, int sync) {
      return Base(vfs)->xDelete(Base(vfs), name, sync);
    };
    vfs_.xAccess = [](sqlite3_vfs* vfs, const char* name, int flags, int* out) {
      return Base(vfs)->xAccess(Base(vfs), name, flags, out);
    };
    vfs_.xFullPathname = [](sqlite3_vfs* vfs, const char* name, int size, char* out) {
      return Base(vfs)->xFullPathname(Base(vfs), name, size, out);
    };
    vfs_.xDlOpen = [](sqlite3_vfs* vfs, const char* name) { return Base(vfs)->xDlOpen(Base(vfs), name); };
    vfs_.xDlError = [](sqlite3_vfs* vfs, int size, char* out) { Base(vfs)->xDlError(Base(vfs), size, out); };
    vfs_.xDlSym = [](sqlite3_vfs* vfs, void* handle, const char* symbol) {
      return Base(vfs)->xDlSym(Base(vfs), handle, symbol);
    };
    vfs_.xDlClose = [](sqlite3_vfs* vfs, void* handle) { Base(vfs)->xDlClose(Base(vfs), handle); };
    vfs_.xRandomness = [](sqlite3_vfs* vfs, int size, char* out) {
      return Base(vfs)->xRandomness(Base(vfs), size, out);
    };
    vfs_.xSleep = [](sqlite3_vfs* vfs, int microseconds) {
      Self(vfs)->Note(std::this_thread::get_id(), &Self(vfs)->sleepers_);
      return Base(vfs)->xSleep(Base(vfs), microseconds);
    };
    vfs_.xCurrentTime = [](sqlite3_vfs* vfs, double* now) { return Base(vfs)->xCurrentTime(Base(vfs), now); };
    vfs_.xGetLastError = [](sqlite3_vfs* vfs, int size, char* out) {
      return Base(vfs)->xGetLastError(Base(vfs), size, out);
    };
    vfs_.xCurrentTimeInt64 = [](sqlite3_vfs* vfs, sqlite3_int64* now) {
      return Base(vfs)->xCurrentTimeInt64(Base(vfs), now);
    };
    sqlite3_vfs_register(&vfs_, /*makeDflt=*/1);
  }
  ~WatchingVfs() {
    sqlite3_vfs_unregister(&vfs_);
    sqlite3_vfs_register(base_, /*makeDflt=*/1);
  }
  WatchingVfs(const WatchingVfs&) = delete;
  WatchingVfs& operator=(const WatchingVfs&) = delete;

  // How the next opens of a main database go.
  void OpenMainDatabase(MainDatabase how) { main_ = how; }

  // What a thread calls when it is done with the database, so that a wait for it ends.
  void NoteReturn() { Note(std::this_thread::get_id(), &returned_); }

  // Blocks until the thread `id` has slept in SQLite or said it returned; whether it slept.
  bool WaitForSleepOf(std::thread::id id) {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [&] { return sleepers_.count(id) > 0 || returned_.count(id) > 0; });
    return sleepers_.count(id) > 0;
  }

 private:
  static WatchingVfs* Self(sqlite3_vfs* vfs) { return static_cast<WatchingVfs*>(vfs->pAppData); }
  static sqlite3_vfs* Base(sqlite3_vfs* vfs) { return Self(vfs)->base_; }
  void Note(std::thread::id id, std::set<std::thread::id>* into) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      into->insert(id);
    }
    changed_.notify_all();
  }

  sqlite3_vfs* const base_;
  sqlite3_vfs vfs_{};
  std::atomic<MainDatabase> main_{MainDatabase::kAsAsked};
  std::mutex mu_;
  std::condition_variable changed_;
  std::set<std::thread::id> sleepers_;  // guarded by mu_
  std::set<std::thread::id> returned_;  // guarded by mu_
};

// Another process's connection holds the database's write lock, and a write through the
// store waits for it (as a commit's fsync would), holding the store's own write lock. Every
// read answers meanwhile, with what was committed: not after the write, and not through
// SQLite's busy timeout, which would run out for the write while a read waited for it.
TEST_F(SqliteStateStoreTest, ReadsAnswerWithTheCommittedStateWhileAWriteWaits) {
  WatchingVfs vfs;  // before the store, so that its connections go through it
  auto opened = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  SqliteStateStore& store = **opened;
  v1::Job job = RunningJob();
  ASSERT_TRUE(store.InsertJob(job).ok());
  CommitRounds(store, &job, 1);
  v1::WorkerStatus w1, w2;
  w1.set_worker_id("w1");
  w2.set_worker_id("w2");
  ASSERT_TRUE(store.SaveWorker(w1).ok());
  ASSERT_TRUE(store.SaveSeat(job.id(), "w1", 0).ok());

  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open((dir_ / "coordinator.db").c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other,
                         "BEGIN IMMEDIATE; INSERT INTO jobs (id, number, job) VALUES ('job-9-xyz', 9, X'');"
                         "INSERT INTO workers (id, worker) VALUES ('w9', X'')",
                         nullptr, nullptr, nullptr),
            SQLITE_OK)
      << sqlite3_errmsg(other);
  Status saved;
  std::thread writer([&] {
    saved = store.SaveWorker(w2);
    vfs.NoteReturn();
  });
  const bool waited = vfs.WaitForSleepOf(writer.get_id());

  auto got = store.GetJob(job.id());
  EXPECT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(store.GetJob("job-9-xyz").status().code(), StatusCode::kNotFound) << "a row never committed was read";
  auto jobs = store.ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status().ToString();
  EXPECT_EQ(jobs->size(), 1u);
  auto newest = store.ListNewestJobs(10);
  ASSERT_TRUE(newest.ok()) << newest.status().ToString();
  EXPECT_EQ(newest->total, 1u);
  EXPECT_EQ(store.NextJobNumber().value(), 2u);
  auto rounds = store.ListRounds(job.id());
  ASSERT_TRUE(rounds.ok()) << rounds.status().ToString();
  EXPECT_EQ(rounds->size(), 1u);
  auto workers = store.LoadWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status().ToString();
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].worker_id(), "w1");
  auto seats = store.LoadSeats(job.id());
  ASSERT_TRUE(seats.ok()) << seats.status().ToString();
  EXPECT_EQ(*seats, (std::vector<std::pair<std::string, uint32_t>>{{"w1", 0}}));

  // The other connection lets go: the write goes through, and is read at once.
  EXPECT_EQ(sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);
  writer.join();
  ASSERT_TRUE(waited) << "the write did not wait for the other connection's lock: " << saved.ToString();
  ASSERT_TRUE(saved.ok()) << "the write gave up on the lock while the reads waited for it: " << saved.ToString();
  workers = store.LoadWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status().ToString();
  ASSERT_EQ(workers->size(), 2u);
  EXPECT_EQ((*workers)[1].worker_id(), "w2");
}

// Each write is read back as soon as it returned, although the reads go through a
// connection of their own.
TEST_F(SqliteStateStoreTest, EveryWriteIsReadAsSoonAsItReturns) {
  auto opened = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  SqliteStateStore& store = **opened;
  v1::Job job = RunningJob();
  ASSERT_TRUE(store.InsertJob(job).ok());
  ASSERT_TRUE(store.GetJob(job.id()).ok());
  EXPECT_EQ(store.ListNewestJobs(10).value().total, 1u);
  EXPECT_EQ(store.NextJobNumber().value(), 2u);

  job.set_error("changed");
  ASSERT_TRUE(store.UpdateJob(job).ok());
  EXPECT_EQ(store.GetJob(job.id()).value().error(), "changed");
  ASSERT_TRUE(store.RequestCancel(job.id()).ok());
  EXPECT_TRUE(store.GetJob(job.id()).value().cancel_requested());

  CommitRounds(store, &job, 2);
  EXPECT_EQ(store.GetJob(job.id()).value().rounds_committed(), 2u);
  EXPECT_EQ(store.ListRounds(job.id()).value().size(), 2u);
  v1::RoundRecord record;
  record.set_round(2);
  record.set_model_sha256("recorded again");
  ASSERT_TRUE(store.UpdateRoundRecord(job, record).ok());
  EXPECT_EQ(store.ListRounds(job.id(), 2).value().at(0).model_sha256(), "recorded again");
  job.set_rounds_committed(1);
  ASSERT_TRUE(store.RewindJob(job).ok());
  EXPECT_EQ(store.ListRounds(job.id()).value().size(), 1u);
  EXPECT_EQ(store.GetJob(job.id()).value().rounds_committed(), 1u);

  v1::WorkerStatus worker;
  worker.set_worker_id("w1");
  ASSERT_TRUE(store.SaveWorker(worker).ok());
  EXPECT_EQ(store.LoadWorkers().value().size(), 1u);
  ASSERT_TRUE(store.ForgetWorker("w1").value());
  EXPECT_TRUE(store.LoadWorkers().value().empty());
  ASSERT_TRUE(store.SaveSeat(job.id(), "w1", 3).ok());
  EXPECT_EQ(store.LoadSeats(job.id()).value(), (std::vector<std::pair<std::string, uint32_t>>{{"w1", 3}}));
}

TEST_F(SqliteStateStoreTest, ADatabaseTheProcessMayOnlyReadIsRefusedNamingIt) {
  { ASSERT_TRUE(SqliteStateStore::Open(dir_.string()).ok()); }
  WatchingVfs vfs;
  vfs.OpenMainDatabase(WatchingVfs::MainDatabase::kReadOnlyToTheProcess);
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_FALSE(store.ok()) << "opened a database every write to would fail";
  EXPECT_EQ(store.status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(store.status().message(),
            "cannot open '" + (dir_ / "coordinator.db").string() + "' for writing: it is read-only to this process");
}

TEST_F(SqliteStateStoreTest, AReadOnlyConnectionThatCannotBeOpenedIsAnErrorNamingTheFile) {
  WatchingVfs vfs;
  vfs.OpenMainDatabase(WatchingVfs::MainDatabase::kNoReadOnlyOpen);
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_FALSE(store.ok()) << "opened without a connection for reads";
  EXPECT_EQ(store.status().message(), "cannot open '" + (dir_ / "coordinator.db").string() +
                                          "' read-only, for the state store's reads: unable to open database file");
}

}  // namespace
}  // namespace tessera::server
