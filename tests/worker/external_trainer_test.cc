// The external trainer's side of the worker: the round's deadline on the worker's clock, and
// rounds handed to a trainer written in sh (no Python needed) that copies the global model back
// as its trained one.
#include "worker/external_trainer.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>
#include <limits>

#include "core/data/numpy_format.h"
#include "tests/fresh_directory.h"

namespace tessera::worker {
namespace {

using std::chrono::hours;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr int64_t kNowUnixMs = 1'800'000'000'000;

// A deadline past what steady_clock's nanoseconds hold (a coordinator's INT64_MAX, a year
// 2500) is far off: wrapped into the past, it killed the trainer before it could reply.
TEST(TrainerDeadlineTest, AFarDeadlineIsFarOffNeverPast) {
  const auto before = steady_clock::now();
  for (int64_t deadline :
       {std::numeric_limits<int64_t>::max(), int64_t{16'725'225'600'000}, kNowUnixMs + (int64_t{1} << 50)}) {
    EXPECT_GT(TrainerDeadline(deadline, kNowUnixMs), before + hours(24 * 365 * 30)) << deadline;
  }
}

TEST(TrainerDeadlineTest, ANearDeadlineIsKeptAndNoneAllowsADay) {
  const auto before = steady_clock::now();
  const auto in_a_minute = TrainerDeadline(kNowUnixMs + 60'000, kNowUnixMs);
  const auto passed = TrainerDeadline(kNowUnixMs - 5'000, kNowUnixMs);
  const auto none = TrainerDeadline(0, kNowUnixMs);
  const auto after = steady_clock::now();
  EXPECT_GE(in_a_minute, before + milliseconds(60'000));
  EXPECT_LE(in_a_minute, after + milliseconds(60'000));
  EXPECT_GE(passed, before);
  EXPECT_LE(passed, after);
  EXPECT_GE(none, before + hours(24));
  EXPECT_LE(none, after + hours(24));
}

// Reads each request from fd 3, keeps a copy of the round's data archive as LOG/data-ROUND.npz,
// copies the model to "out" and replies; with "twice", round 1 is answered with a second line
// in the same write, as a trainer that calls fail() after send() does; with "chatty", round 1's
// reply comes after a line that is not one, as a library's print on the reply channel; with
// "spawn", it starts two children (their pids in LOG/child-N.pid) and never replies; with
// "partial", it writes OUT.tmp.npz (as tessera_client does before its rename) and never replies;
// with "once", it exits after its first reply.
constexpr char kCopyingTrainer[] = R"sh(log="$1"
while IFS= read -r line <&3; do
  field() { printf '%s\n' "$line" | sed -n "s/.*\"$1\": \"\([^\"]*\)\".*/\1/p"; }
  round=$(printf '%s\n' "$line" | sed -n 's/.*"round": \([0-9]*\).*/\1/p')
  cp "$(field data)" "$log/data-$round.npz"
  cp "$(field model)" "$(field out)"
  if [ "$2" = twice ] && [ "$round" = 1 ]; then
    printf '{"type": "update", "samples": 1}\n{"type": "error", "message": "late"}\n' >&4
  elif [ "$2" = chatty ] && [ "$round" = 1 ]; then
    printf 'loading weights\n{"type": "update", "samples": 1}\n' >&4
  elif [ "$2" = partial ]; then
    cp "$(field model)" "$(field out).tmp.npz"
    sleep 600
  elif [ "$2" = spawn ]; then
    sleep 600 & echo $! > "$log/child-1.pid"
    sleep 600 & echo $! > "$log/child-2.pid"
    wait
  else
    printf '{"type": "update", "samples": 1}\n' >&4
  fi
  if [ "$2" = once ]; then exit 0; fi
done
)sh";

class ExternalTrainerRoundTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::tessera::testing::FreshTestDirectory("tessera-external-trainer");
    std::filesystem::create_directories(dir_ / "work");
    std::ofstream(dir_ / "trainer.sh") << kCopyingTrainer;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The trainer `name`, which keeps its copies in DIR/NAME; `mode` as kCopyingTrainer reads it.
  std::unique_ptr<ExternalTrainer> Trainer(const std::string& name, const std::string& mode = "copy") {
    std::filesystem::create_directories(dir_ / name);
    TrainerCommand command{name, {"/bin/sh", (dir_ / "trainer.sh").string(), (dir_ / name).string(), mode}};
    return std::make_unique<ExternalTrainer>(command, (dir_ / "work").string());
  }

  // Two samples of 1x1x2, labelled `label`.
  static Dataset Share(uint8_t label) {
    Dataset share;
    share.count = 2;
    share.channels = share.rows = 1;
    share.cols = 2;
    share.images = {1, 2, 3, 4};
    share.labels = {label, label};
    return share;
  }

  // `should_stop` as the worker's round passes it: a cancel or the deadline.
  static Result<ExternalTrainerResult> Round(ExternalTrainer& trainer, uint32_t round, const Dataset& share,
                                             const std::string& share_key,
                                             const std::function<bool()>& should_stop = [] { return false; }) {
    ExternalTrainerRequest request;
    request.job_id = "job";
    request.round = round;
    request.attempt = 1;
    const TensorSet global = {{"w", {2}, {0.5f, -0.5f}}};
    return trainer.Train(request, global, share, share_key, steady_clock::now() + std::chrono::minutes(2), should_stop);
  }

  // The labels of the data archive the trainer `name` was handed in `round`.
  std::vector<int64_t> LabelsHandedOver(const std::string& name, uint32_t round) {
    auto arrays = ReadNpz((dir_ / name / ("data-" + std::to_string(round) + ".npz")).string());
    EXPECT_TRUE(arrays.ok()) << arrays.status().ToString();
    if (!arrays.ok()) return {};
    for (const NumpyArray& a : *arrays) {
      if (a.name == "y") return a.ToInt64("y").value();
    }
    ADD_FAILURE() << "no array y";
    return {};
  }

  std::filesystem::path dir_;
};

// The worker's trainers share one work directory. Each writes its share only when it changes:
// under one name for all of them, trainer a's third round read trainer b's share, written over
// a's in between.
TEST_F(ExternalTrainerRoundTest, TwoTrainersOfOneWorkerEachHandOverTheirOwnShare) {
  auto a = Trainer("a"), b = Trainer("b");
  const Dataset first = Share(1), second = Share(2);
  auto trained = Round(*a, 1, first, "job1#0");
  ASSERT_TRUE(trained.ok()) << trained.status().ToString();
  trained = Round(*b, 1, second, "job2#0");
  ASSERT_TRUE(trained.ok()) << trained.status().ToString();
  trained = Round(*a, 2, first, "job1#0");
  ASSERT_TRUE(trained.ok()) << trained.status().ToString();
  EXPECT_EQ(LabelsHandedOver("a", 1), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(LabelsHandedOver("b", 1), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(LabelsHandedOver("a", 2), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(trained->model[0].values, (std::vector<float>{0.5f, -0.5f}));
}

// A second reply to round 1 was read as round 2's, and round 2's as round 3's, for as long as
// the process lived: every later round failed. It now fails the next round, naming what came,
// and the round after runs on a fresh process.
TEST_F(ExternalTrainerRoundTest, AReplyNoRoundAskedForFailsTheNextRoundAndRestartsTheProcess) {
  auto trainer = Trainer("twice", "twice");
  const Dataset share = Share(1);
  auto trained = Round(*trainer, 1, share, "job#0");
  ASSERT_TRUE(trained.ok()) << trained.status().ToString();
  const pid_t first = trainer->pid();
  trained = Round(*trainer, 2, share, "job#0");
  ASSERT_FALSE(trained.ok());
  EXPECT_EQ(trained.status().code(), StatusCode::kInvalidArgument) << trained.status().ToString();
  EXPECT_NE(trained.status().message().find("replied when no round was asked of it"), std::string::npos)
      << trained.status().ToString();
  EXPECT_NE(trained.status().message().find("late"), std::string::npos) << trained.status().ToString();
  EXPECT_EQ(trainer->pid(), 0);
  trained = Round(*trainer, 3, share, "job#0");
  ASSERT_TRUE(trained.ok()) << trained.status().ToString();
  EXPECT_NE(trainer->pid(), first);
  trained = Round(*trainer, 4, share, "job#0");
  EXPECT_TRUE(trained.ok()) << trained.status().ToString();
}

// A reply line that is not one (here a print before the real reply) failed its round and left
// the process running, out of step: its real reply was then taken for the next round's, or
// failed it as unasked. The process is stopped with the round, and the next one starts afresh.
TEST_F(ExternalTrainerRoundTest, AMalformedReplyFailsItsRoundAndRestartsTheProcess) {
  auto trainer = Trainer("chatty", "chatty");
  const Dataset share = Share(1);
  auto trained = Round(*trainer, 1, share, "job#0");
  ASSERT_FALSE(trained.ok());
  EXPECT_EQ(trained.status().code(), StatusCode::kInvalidArgument) << trained.status().ToString();
  EXPECT_NE(trained.status().message().find("the reply is not a JSON object: 'loading weights'"), std::string::npos)
      << trained.status().ToString();
  EXPECT_NE(trained.status().message().find("the next round starts a fresh one"), std::string::npos)
      << trained.status().ToString();
  EXPECT_EQ(trainer->pid(), 0);
  for (uint32_t round : {2u, 3u}) {
    trained = Round(*trainer, round, share, "job#0");
    EXPECT_TRUE(trained.ok()) << "round " << round << ": " << trained.status().ToString();
  }
}

// A trained model holding a NaN or an infinity (here the copying trainer hands back a global
// model that holds them) was taken as it was and became the update's delta. The round fails,
// naming the trainer, the tensor and its first bad element; the process, in step, is kept.
TEST_F(ExternalTrainerRoundTest, ATrainedModelThatIsNotFiniteFailsItsRound) {
  auto trainer = Trainer("copy");
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  ExternalTrainerRequest request;
  request.job_id = "job";
  request.round = 1;
  request.attempt = 1;
  for (const auto& [global, said] :
       {std::pair<TensorSet, std::string>{{{"a", {1}, {1.0f}}, {"w", {3}, {0.5f, nan, inf}}},
                                          "tensor 'w' element 1 is NaN"},
        {{{"a", {1}, {1.0f}}, {"w", {3}, {0.5f, -0.5f, -inf}}}, "tensor 'w' element 2 is infinite"}}) {
    auto trained = trainer->Train(request, global, Share(1), "job#0", steady_clock::now() + std::chrono::minutes(2),
                                  [] { return false; });
    ASSERT_FALSE(trained.ok()) << said;
    EXPECT_EQ(trained.status().code(), StatusCode::kInvalidArgument) << trained.status().ToString();
    const std::string expected =
        "external trainer 'copy', job job round " + std::to_string(request.round) + ": its trained model: " + said;
    EXPECT_NE(trained.status().message().find(expected), std::string::npos) << trained.status().ToString();
    EXPECT_GT(trainer->pid(), 0) << "the process in step was stopped";
    ++request.round;
  }
  EXPECT_TRUE(Round(*trainer, 3, Share(1), "job#0").ok());
}

// Whether process `pid` has ended (gone, or a zombie not yet reaped by its new parent).
bool Ended(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

// A trainer killed mid-round (a cancel, the round's deadline) took only its own process with it:
// what it had started (a shell's command, PyTorch's data loader workers) went on running, and
// holding what it held, for as long as it liked. The trainer runs in a process group of its own,
// killed whole.
TEST_F(ExternalTrainerRoundTest, ATrainerKilledMidRoundTakesItsChildrenWithIt) {
  auto trainer = Trainer("spawn", "spawn");
  const auto children_started = [&] {
    std::error_code error;
    return std::filesystem::file_size(dir_ / "spawn" / "child-2.pid", error) > 0 && !error;
  };
  auto trained = Round(*trainer, 1, Share(1), "job#0", children_started);  // stopped once both children run
  ASSERT_FALSE(trained.ok());
  EXPECT_EQ(trained.status().code(), StatusCode::kCancelled) << trained.status().ToString();
  EXPECT_EQ(trainer->pid(), 0);
  for (const char* file : {"child-1.pid", "child-2.pid"}) {
    pid_t child = 0;
    std::ifstream(dir_ / "spawn" / file) >> child;
    ASSERT_GT(child, 0) << file;
    const auto until = steady_clock::now() + std::chrono::seconds(30);
    while (!Ended(child) && steady_clock::now() < until) std::this_thread::sleep_for(milliseconds(10));
    EXPECT_TRUE(Ended(child)) << file << ": the trainer's child " << child << " outlived it";
    if (!Ended(child)) kill(child, SIGKILL);
  }
}

// A trainer killed mid-write (the round's deadline, a cancel) left tessera_client's temporary,
// OUT.tmp.npz, a model-sized file, in the work directory until the worker exited: one more for
// each such round. It goes with the round's other files.
TEST_F(ExternalTrainerRoundTest, ATrainerKilledWhileWritingItsModelLeavesNoTemporaryBehind) {
  auto trainer = Trainer("partial", "partial");
  const auto temporary = dir_ / "work" / "update-1-1.npz.tmp.npz";
  auto trained = Round(*trainer, 1, Share(1), "job#0", [&] { return std::filesystem::exists(temporary); });
  ASSERT_FALSE(trained.ok());
  EXPECT_EQ(trained.status().code(), StatusCode::kCancelled) << trained.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(temporary));
  for (const auto& entry : std::filesystem::directory_iterator(dir_ / "work")) {
    EXPECT_EQ(entry.path().filename().string().rfind("share-", 0), 0u) << entry.path();
  }
}

// A trainer that exited between rounds (a crash, an out-of-memory kill) failed the next round
// at its request; the next round now starts a fresh one.
TEST_F(ExternalTrainerRoundTest, ATrainerThatExitedBetweenRoundsIsReplacedAtTheNext) {
  auto trainer = Trainer("once", "once");
  const Dataset share = Share(1);
  auto trained = Round(*trainer, 1, share, "job#0");
  ASSERT_TRUE(trained.ok()) << trained.status().ToString();
  const pid_t first = trainer->pid();
  ASSERT_GT(first, 0);
  const auto until = steady_clock::now() + std::chrono::seconds(30);
  while (!Ended(first) && steady_clock::now() < until) std::this_thread::sleep_for(milliseconds(10));
  ASSERT_TRUE(Ended(first)) << "the trainer did not exit after its reply";
  trained = Round(*trainer, 2, share, "job#0");
  ASSERT_TRUE(trained.ok()) << trained.status().ToString();
  EXPECT_NE(trainer->pid(), first);
}

}  // namespace
}  // namespace tessera::worker
