// A small command-line flag parser for Tessera's binaries: `--name value` or `--name=value`,
// boolean flags without a value, positional arguments kept in order. Unknown flags and
// malformed values are errors that name the flag.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"

namespace tessera {

class FlagSet {
 public:
  // Declares flags; `help` lines are listed by Usage().
  void String(const std::string& name, std::string* target, const std::string& help);
  void Int(const std::string& name, int64_t* target, const std::string& help);
  void Double(const std::string& name, double* target, const std::string& help);
  void Bool(const std::string& name, bool* target, const std::string& help);

  // Parses argv[first..]; positional arguments go to positional().
  Status Parse(int argc, char** argv, int first = 1);
  const std::vector<std::string>& positional() const { return positional_; }
  // "  --name VALUE   help (default: ...)" lines.
  std::string Usage() const;

 private:
  enum class Kind { kString, kInt, kDouble, kBool };
  struct Flag {
    Kind kind;
    void* target;
    std::string help;
    std::string default_value;
  };
  Status Set(const std::string& name, Flag& flag, const std::string& value);
  std::map<std::string, Flag> flags_;
  std::vector<std::string> order_;
  std::vector<std::string> positional_;
};

// The secret in `path` (its first line, trimmed of trailing whitespace), as a
// --join-token-file flag names it. InvalidArgument naming the flag and the file when the file
// cannot be read or the line is empty.
Result<std::string> ReadSecretFile(const std::string& flag, const std::string& path);

}  // namespace tessera
