// FlagSet: a typo is an error that names the flag and what was expected, never a default.
#include "base/flags.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "base/escape.h"

namespace tessera {
namespace {

Status ParseArgs(FlagSet& flags, std::vector<std::string> args) {
  args.insert(args.begin(), "binary");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return flags.Parse(static_cast<int>(argv.size()), argv.data());
}

Status ParseFlagsOnly(FlagSet& flags, std::vector<std::string> args) {
  args.insert(args.begin(), "binary");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return flags.ParseFlagsOnly(static_cast<int>(argv.size()), argv.data());
}

// "--insecure false" would leave --insecure on and drop "false": a program that takes flags
// only refuses the stray word, and says how a boolean takes its value.
TEST(FlagsTest, AProgramOfFlagsOnlyRefusesAStrayWordAndABooleansValueGivenApart) {
  bool insecure = false;
  FlagSet flags;
  flags.Bool("insecure", &insecure, "");
  Status s = ParseFlagsOnly(flags, {"--insecure", "false"});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "unexpected argument 'false' (a boolean flag takes its value after '=': --FLAG=false)");
  bool forgot = false;
  FlagSet other;
  other.Bool("insecure", &forgot, "");
  EXPECT_EQ(ParseFlagsOnly(other, {"coordinator.example.org:7070"}).message(),
            "unexpected argument 'coordinator.example.org:7070' (flags only; see --help)");
  bool off = true;
  FlagSet given;
  given.Bool("insecure", &off, "");
  ASSERT_TRUE(ParseFlagsOnly(given, {"--insecure=false"}).ok());
  EXPECT_FALSE(off);
  EXPECT_EQ(given.Given(), std::vector<std::string>{"insecure"});
}

// A value forgotten is not taken from the next flag; an empty boolean is not true; "--" ends
// the flags.
TEST(FlagsTest, AFlagsValueIsNeverTheNextFlagAndDoubleDashEndsTheFlags) {
  std::string out;
  bool json = false;
  FlagSet flags;
  flags.String("o", &out, "");
  flags.Bool("json", &json, "");
  Status s = ParseArgs(flags, {"-o", "--json"});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("flag --o needs a value, got the flag --json"), std::string::npos) << s.message();
  EXPECT_TRUE(out.empty());
  FlagSet dashes;
  dashes.String("o", &out, "");
  ASSERT_TRUE(ParseArgs(dashes, {"--o=--odd-name"}).ok());
  EXPECT_EQ(out, "--odd-name");
  FlagSet empty;
  empty.Bool("json", &json, "");
  EXPECT_EQ(ParseArgs(empty, {"--json="}).message(), "flag --json: expected true or false, got ''");
  FlagSet end;
  end.Bool("json", &json, "");
  ASSERT_TRUE(ParseArgs(end, {"--json", "--", "--not-a-flag", "-x"}).ok());
  EXPECT_EQ(end.positional(), (std::vector<std::string>{"--not-a-flag", "-x"}));
}

TEST(FlagsTest, AChoiceFlagAcceptsOnlyItsChoices) {
  std::string level = "info";
  FlagSet flags;
  flags.Choice("log-level", &level, {"trace", "debug", "info", "warn", "error", "off"}, "what to log");
  ASSERT_TRUE(ParseArgs(flags, {"--log-level=debug"}).ok());
  EXPECT_EQ(level, "debug");
  FlagSet again;
  again.Choice("log-level", &level, {"trace", "debug", "info", "warn", "error", "off"}, "what to log");
  Status s = ParseArgs(again, {"--log-level", "verbose"});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "flag --log-level: expected trace, debug, info, warn, error or off, got 'verbose'");
  EXPECT_EQ(level, "debug") << "a refused value changes nothing";
  EXPECT_NE(again.Usage().find("(trace, debug, info, warn, error or off) (default: debug)"), std::string::npos)
      << again.Usage();
}

TEST(FlagsTest, IntegersAreRangeChecked) {
  int64_t kib = 1024;
  FlagSet flags;
  flags.Int("chunk-kib", &kib, "upload chunk size in KiB", IntRange{1, 1024});
  EXPECT_EQ(ParseArgs(flags, {"--chunk-kib", "4096"}).message(), "flag --chunk-kib: expected 1 to 1024, got '4096'");
  FlagSet f2;
  f2.Int("chunk-kib", &kib, "", IntRange{1, 1024});
  EXPECT_EQ(ParseArgs(f2, {"--chunk-kib=0"}).message(), "flag --chunk-kib: expected 1 to 1024, got '0'");
  FlagSet f3;
  f3.Int("chunk-kib", &kib, "", IntRange{1, 1024});
  EXPECT_EQ(ParseArgs(f3, {"--chunk-kib=99999999999999999999"}).message(),
            "flag --chunk-kib: expected 1 to 1024, got '99999999999999999999'");
  FlagSet f4;
  f4.Int("chunk-kib", &kib, "", IntRange{1, 1024});
  EXPECT_EQ(ParseArgs(f4, {"--chunk-kib=12k"}).message(), "flag --chunk-kib: expected an integer, got '12k'");
  FlagSet f5;
  f5.Int("chunk-kib", &kib, "", IntRange{1, 1024});
  ASSERT_TRUE(ParseArgs(f5, {"--chunk-kib=512"}).ok());
  EXPECT_EQ(kib, 512);
}

// strtoll would take "+80" and " 80": an integer flag takes decimal digits, with a '-' only
// before them, and nothing else.
TEST(FlagsTest, AnIntegerIsExactlyDecimalDigitsWithAnOptionalMinus) {
  int64_t port = 7;
  auto parse = [&](std::vector<std::string> args) {
    FlagSet flags;  // a flag set takes each flag once
    flags.Int("port", &port, "", IntRange{-100, 65535});
    return ParseArgs(flags, args);
  };
  for (const std::string& value : {"+80", " 80", "\t80", "0x50", "0X50", "80 ", "80x", "8 0", "", "-", "+", "- 80",
                                   "+-80", "--80", "80.0", "1e2"}) {
    EXPECT_EQ(parse({"--port=" + value}).message(),
              "flag --port: expected an integer, got " + QuoteUntrusted(value)) << value;
    EXPECT_EQ(port, 7) << value;
  }
  EXPECT_EQ(parse({"--port", "+80"}).message(), "flag --port: expected an integer, got '+80'");
  EXPECT_EQ(port, 7);
  ASSERT_TRUE(parse({"--port", "80"}).ok());
  EXPECT_EQ(port, 80);
  ASSERT_TRUE(parse({"--port=-12"}).ok());
  EXPECT_EQ(port, -12);
  ASSERT_TRUE(parse({"--port=080"}).ok());  // decimal, never octal
  EXPECT_EQ(port, 80);
}

TEST(FlagsTest, UnknownAndRepeatedFlagsAreErrors) {
  std::string listen;
  FlagSet flags;
  flags.String("listen", &listen, "");
  EXPECT_EQ(ParseArgs(flags, {"--lisen", "x"}).message(), "unknown flag --lisen (see --help)");
  FlagSet twice;
  twice.String("listen", &listen, "");
  EXPECT_EQ(ParseArgs(twice, {"--listen", "a:1", "--listen=b:2"}).message(), "flag --listen is given twice");
  FlagSet hostile;
  EXPECT_EQ(ParseArgs(hostile, {"--a\nb"}).message(), "unknown flag --a\\nb (see --help)");
}

TEST(FlagsTest, AListFlagCollectsEveryValueInOrder) {
  std::vector<std::string> datasets;
  std::string listen;
  FlagSet flags;
  flags.StringList("dataset", &datasets, "NAME=DIR");
  flags.String("listen", &listen, "");
  ASSERT_TRUE(ParseArgs(flags, {"--dataset", "a=/x", "--listen", "h:1", "--dataset=b=/y"}).ok());
  EXPECT_EQ(datasets, (std::vector<std::string>{"a=/x", "b=/y"}));
  EXPECT_NE(flags.Usage().find("(repeatable)"), std::string::npos) << flags.Usage();
  FlagSet missing;
  missing.StringList("dataset", &datasets, "");
  EXPECT_EQ(ParseArgs(missing, {"--dataset"}).message(), "flag --dataset needs a value");
}

// "--tls-client-ca $CA" with CA unset would serve TLS without client certificates: an empty
// value is refused, unless the flag says what empty means.
TEST(FlagsTest, AnEmptyValueIsRefusedUnlessTheFlagSaysWhatItMeans) {
  std::string ca = "default";
  std::string fallback = "cpu";
  std::vector<std::string> datasets;
  for (const std::vector<std::string>& args : {std::vector<std::string>{"--tls-client-ca="},
                                               std::vector<std::string>{"--tls-client-ca", ""}}) {
    FlagSet flags;
    flags.String("tls-client-ca", &ca, "");
    EXPECT_EQ(ParseArgs(flags, args).message(), "flag --tls-client-ca: expected a non-empty value, got ''");
    EXPECT_EQ(ca, "default");
  }
  FlagSet list;
  list.StringList("dataset", &datasets, "");
  EXPECT_EQ(ParseArgs(list, {"--dataset", "a=/x", "--dataset="}).message(),
            "flag --dataset: expected a non-empty value, got ''");
  FlagSet allowed;
  allowed.String("fallback-device", &fallback, "", EmptyValue::kAllowed);
  ASSERT_TRUE(ParseArgs(allowed, {"--fallback-device", ""}).ok());
  EXPECT_EQ(fallback, "");
}

TEST(FlagsTest, ASingleDashIsAMistypedFlagButDashHAsksForHelp) {
  bool help = false;
  bool json = false;
  FlagSet flags;
  flags.Bool("help", &help, "");
  flags.Bool("json", &json, "");
  ASSERT_TRUE(ParseArgs(flags, {"watch", "-h"}).ok());
  EXPECT_TRUE(help);
  EXPECT_EQ(flags.positional(), std::vector<std::string>{"watch"}) << "-h is not a job id";
  FlagSet typo;
  typo.Bool("json", &json, "");
  EXPECT_EQ(ParseArgs(typo, {"jobs", "-json"}).message(),
            "unknown flag -json (flags start with two dashes; see --help)");
  std::string out;
  FlagSet letter;
  letter.String("o", &out, "");
  ASSERT_TRUE(ParseArgs(letter, {"trace", "-o", "t.json"}).ok());
  EXPECT_EQ(out, "t.json") << "a one-letter flag takes one dash too";
  FlagSet no_help;
  EXPECT_EQ(ParseArgs(no_help, {"-h"}).code(), StatusCode::kInvalidArgument) << "no --help flag declared";
  FlagSet numbers;
  ASSERT_TRUE(ParseArgs(numbers, {"-", "-1"}).ok()) << "stdin and negative numbers stay arguments";
  EXPECT_EQ(numbers.positional(), (std::vector<std::string>{"-", "-1"}));
}

TEST(FlagsTest, UsageShowsOneLetterFlagsWithOneDashAndNoSentinelDefault) {
  std::string out;
  int64_t round = -1;
  FlagSet flags;
  flags.String("o", &out, "the output");
  flags.Int("round", &round, "only this round", IntRange{0, 100});
  const std::string usage = flags.Usage();
  EXPECT_NE(usage.find("  -o VALUE"), std::string::npos) << usage;
  EXPECT_EQ(usage.find("default: -1"), std::string::npos) << usage;
  EXPECT_NE(usage.find("(0 to 100)"), std::string::npos) << usage;
}

TEST(FlagsTest, UsageCanListSomeFlags) {
  std::string a, b;
  FlagSet flags;
  flags.String("alpha", &a, "the first");
  flags.String("beta", &b, "the second");
  EXPECT_EQ(flags.Usage({"beta", "nonesuch"}).find("alpha"), std::string::npos);
  EXPECT_NE(flags.Usage({"beta"}).find("--beta VALUE"), std::string::npos);
  EXPECT_NE(flags.Usage().find("--alpha VALUE"), std::string::npos);
}

TEST(FlagsTest, NumbersMustBeFiniteAndDecimal) {
  double threshold = 0.5;
  auto parse = [&](std::vector<std::string> args) {
    FlagSet flags;  // a flag set takes each flag once
    flags.Double("threshold", &threshold, "");
    return ParseArgs(flags, args);
  };
  EXPECT_EQ(parse({"--threshold=nan"}).message(), "flag --threshold: expected a finite decimal number, got 'nan'");
  // strtod reads C's hexadecimal floats too: 0x10 would be 16.
  EXPECT_EQ(parse({"--threshold=0x10"}).message(), "flag --threshold: expected a finite decimal number, got '0x10'");
  EXPECT_EQ(parse({"--threshold", "0X1p-2"}).message(),
            "flag --threshold: expected a finite decimal number, got '0X1p-2'");
  ASSERT_TRUE(parse({"--threshold=2.5e-1"}).ok());
  EXPECT_EQ(threshold, 0.25);
}

// strtod would take "+0.5", " 0.5", "inf" and "nan": a decimal flag takes what an integer
// flag takes and a fraction or exponent, nothing else, within its range.
TEST(FlagsTest, ADecimalIsRefusedWithAPlusASpaceOrNoFiniteValue) {
  double threshold = 0.5;
  auto parse = [&](std::vector<std::string> args, DoubleRange range = {}) {
    FlagSet flags;  // a flag set takes each flag once
    flags.Double("threshold", &threshold, "", range);
    return ParseArgs(flags, args);
  };
  for (const std::string& value : {"+0.25", "+.25", "+1e3", " 0.25", "\t1", "0.25 ", "inf", "-inf", "+inf",
                                   "infinity", "nan", "-nan", "1e999", "-", ".", "+", "-+1", "1,5", "0x1p3"}) {
    EXPECT_EQ(parse({"--threshold=" + value}).message(),
              "flag --threshold: expected a finite decimal number, got " + QuoteUntrusted(value))
        << value;
    EXPECT_EQ(threshold, 0.5) << value;
  }
  EXPECT_EQ(parse({"--threshold", "+2"}).message(), "flag --threshold: expected a finite decimal number, got '+2'");
  ASSERT_TRUE(parse({"--threshold=-1.5"}).ok());
  EXPECT_EQ(threshold, -1.5);
  ASSERT_TRUE(parse({"--threshold=.5"}).ok());
  EXPECT_EQ(threshold, 0.5);
  ASSERT_TRUE(parse({"--threshold=1e3"}).ok());
  EXPECT_EQ(threshold, 1000);
  EXPECT_EQ(parse({"--threshold=0.0001"}, DoubleRange{0.001, 86400}).message(),
            "flag --threshold: expected 0.001 to 86400, got '0.0001'");
  EXPECT_EQ(threshold, 1000) << "a refused value changes nothing";
  ASSERT_TRUE(parse({"--threshold=86400"}, DoubleRange{0.001, 86400}).ok());
  EXPECT_EQ(threshold, 86400);
  FlagSet shown;
  shown.Double("timeout-s", &threshold, "the limit", DoubleRange{0.5, 60});
  EXPECT_NE(shown.Usage().find("the limit (0.5 to 60) (default: 86400)"), std::string::npos) << shown.Usage();
}

// A tool that reads a flag's value itself (a list, a value kept as text) reads it as the flag
// parser does.
TEST(FlagsTest, TheParsersAreSharedWithToolsThatReadAValueThemselves) {
  EXPECT_EQ(ParseIntFlag("ranks", "+4", IntRange{1, 64}).status().message(),
            "flag --ranks: expected an integer, got '+4'");
  EXPECT_EQ(ParseIntFlag("ranks", "65", IntRange{1, 64}).status().message(), "flag --ranks: expected 1 to 64, got '65'");
  EXPECT_EQ(*ParseIntFlag("ranks", "64", IntRange{1, 64}), 64);
  EXPECT_EQ(ParseDecimalFlag("rate", "+1").status().message(), "flag --rate: expected a finite decimal number, got '+1'");
  EXPECT_EQ(*ParseDecimalFlag("rate", "0.125"), 0.125);

  auto list = ParseIntListFlag("ranks", "2,4,8", IntRange{1, 64});
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EXPECT_EQ(*list, (std::vector<int64_t>{2, 4, 8}));
  // Each item is an integer in range: no sign, space, empty item, trailing text, or wrap of
  // a negative to a huge unsigned.
  for (const std::string& value : {"", ",", "2,", ",2", "2,,4", "+2", " 2", "2 ", "2, 4", "2x", "0x4", "0", "65",
                                   "-1", "-18446744073709551615", "18446744073709551617", "2;4", "4.0"}) {
    EXPECT_EQ(ParseIntListFlag("ranks", value, IntRange{1, 64}).status().message(),
              "flag --ranks: expected comma-separated integers from 1 to 64, got " + QuoteUntrusted(value))
        << value;
  }
}

TEST(FlagsTest, ASecretFileIsBoundedAndNeverEchoed) {
  const auto dir = std::filesystem::temp_directory_path() / ("tessera-flags-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string good = (dir / "token").string();
  std::ofstream(good) << "s3cret  \nsecond line\n";
  auto token = ReadSecretFile("join-token-file", good);
  ASSERT_TRUE(token.ok()) << token.status().ToString();
  EXPECT_EQ(*token, "s3cret");
  const std::string huge = (dir / "huge").string();
  std::ofstream(huge) << std::string(5000, 'k');
  auto refused = ReadSecretFile("join-token-file", huge);
  EXPECT_EQ(refused.status().message(), "--join-token-file '" + huge +
                                            "': expected a secret of at most 1024 bytes on its first line, got more");
  auto missing = ReadSecretFile("join-token-file", (dir / "missing").string());
  EXPECT_EQ(missing.status().message(), "--join-token-file '" + (dir / "missing").string() + "': cannot read it");
  // A directory opens, reads as empty, and would be called a file whose first line is empty.
  EXPECT_EQ(ReadSecretFile("admin-token-file", dir.string()).status().message(),
            "--admin-token-file '" + dir.string() + "': expected a file, got a directory");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera
