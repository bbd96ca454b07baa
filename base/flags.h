// A small command-line flag parser for Tessera's binaries: `--name value` or `--name=value`,
// boolean flags without a value or with one after '=' (`--insecure=false`), positional
// arguments kept in order, and `--` ending the flags. A typo is an error,
// never a silent default: unknown flags, a flag given twice, a malformed number (an integer
// is decimal digits with an optional '-': no '+', spaces, hex or trailing text), a number
// out of its range, a value outside a choice flag's choices and an empty value (`--name=`, or
// `--name "$UNSET"`, which would otherwise leave the flag at its default) are errors that name
// the flag, say what was expected, and show the value (escaped and bounded). A decimal number
// is finite and written in decimal: no '+', spaces, hex, nan or inf.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"

namespace tessera {

// The values an integer flag accepts, both ends included.
struct IntRange {
  int64_t min = std::numeric_limits<int64_t>::min();
  int64_t max = std::numeric_limits<int64_t>::max();
};

// The values a decimal flag accepts, both ends included.
struct DoubleRange {
  double min = std::numeric_limits<double>::lowest();
  double max = std::numeric_limits<double>::max();
};

// Whether a string flag takes an empty value: refused unless the flag says what empty means
// ("--fallback-device ''": none).
enum class EmptyValue { kRefused, kAllowed };

class FlagSet {
 public:
  // Declares flags; `help` lines are listed by Usage().
  void String(const std::string& name, std::string* target, const std::string& help,
              EmptyValue empty = EmptyValue::kRefused);
  // A string that must be one of `choices` (Usage lists them).
  void Choice(const std::string& name, std::string* target, std::vector<std::string> choices,
              const std::string& help);
  void Int(const std::string& name, int64_t* target, const std::string& help, IntRange range = {});
  void Double(const std::string& name, double* target, const std::string& help, DoubleRange range = {});
  void Bool(const std::string& name, bool* target, const std::string& help);
  // A flag that may be given more than once; each value (never empty) is appended, in order.
  void StringList(const std::string& name, std::vector<std::string>* target, const std::string& help);

  // Parses argv[first..]; positional arguments go to positional().
  Status Parse(int argc, char** argv, int first = 1);
  const std::vector<std::string>& positional() const { return positional_; }
  // The names of the flags given on the command line, in name order.
  std::vector<std::string> Given() const;
  // Whether flag `name` was given (a default value equal to a given one still counts as given).
  bool WasGiven(const std::string& name) const;
  // Parse() for a program that takes no positional arguments (the daemons, the benchmarks):
  // one is InvalidArgument, naming it, with a hint when it is a boolean's value given apart
  // ("--insecure false" would otherwise leave --insecure on).
  Status ParseFlagsOnly(int argc, char** argv, int first = 1);
  // "  --name VALUE   help (default: ...)" lines, for every flag or for `only` (in their order).
  std::string Usage() const;
  std::string Usage(const std::vector<std::string>& only) const;

 private:
  enum class Kind { kString, kChoice, kInt, kDouble, kBool, kStringList };
  struct Flag {
    Kind kind;
    void* target;
    std::string help;
    std::string default_value;
    std::vector<std::string> choices;  // kChoice
    IntRange range;                    // kInt
    DoubleRange double_range;          // kDouble
    bool seen = false;
    bool allow_empty = false;          // kString
  };
  Status Set(const std::string& name, Flag& flag, const std::string& value);
  std::map<std::string, Flag> flags_;
  std::vector<std::string> order_;
  std::vector<std::string> positional_;
};

// The readers behind Int and Double flags, for a tool that reads a flag's value itself (a list
// of numbers, a value taken from a string flag). `name` is the flag's, without its dashes.
// An integer is decimal digits with an optional leading '-' and nothing else; InvalidArgument
// "flag --NAME: expected an integer, got 'VALUE'", or "expected MIN to MAX" when out of range.
Result<int64_t> ParseIntFlag(const std::string& name, const std::string& value, IntRange range = {});
// A finite decimal number ("2.5", "-1e-3", ".5"): no '+', spaces, hex, nan or inf;
// InvalidArgument "flag --NAME: expected a finite decimal number, got 'VALUE'", or "expected
// MIN to MAX" when out of range.
Result<double> ParseDecimalFlag(const std::string& name, const std::string& value, DoubleRange range = {});
// Comma-separated integers, each as ParseIntFlag reads one and within `range` ("2,4,8"); no
// empty item. InvalidArgument "flag --NAME: expected comma-separated integers from MIN to MAX,
// got 'VALUE'".
Result<std::vector<int64_t>> ParseIntListFlag(const std::string& name, const std::string& value, IntRange range);

// "a, b or c".
std::string JoinChoices(const std::vector<std::string>& choices);

// The secret in `path` (its first line, at most 1 KiB, trimmed of trailing whitespace), as a
// --join-token-file flag names it. InvalidArgument naming the flag and the file when the file
// cannot be read, is a directory, or the line is empty.
Result<std::string> ReadSecretFile(const std::string& flag, const std::string& path);

// InvalidArgument "NAMED: expected a file, got a directory" when `path` is a directory, which
// std::ifstream opens and then reads as empty (a reader would call the file empty or malformed);
// OK otherwise, whatever else is wrong with the file being its reader's to say. `named` is the
// flag and the file as the reader's errors name them ("--tls-ca '/etc/pki'").
Status RefuseDirectory(const std::string& named, const std::string& path);

// OK when `path` is a directory that exists; otherwise InvalidArgument "NAMED: expected a
// directory, got a file" or "NAMED: cannot read it (No such file or directory)", so that a
// mistyped directory stops a daemon at start rather than a job at its first round.
Status CheckDirectory(const std::string& named, const std::string& path);

}  // namespace tessera
