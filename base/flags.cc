#include "base/flags.h"

#include <sys/stat.h>

#include <cctype>
#include <cmath>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "base/escape.h"
#include "base/format.h"

namespace tessera {

void FlagSet::String(const std::string& name, std::string* target, const std::string& help, EmptyValue empty) {
  flags_[name] = Flag{Kind::kString, target, help, *target, {}, {}};
  flags_[name].allow_empty = empty == EmptyValue::kAllowed;
  order_.push_back(name);
}
void FlagSet::StringList(const std::string& name, std::vector<std::string>* target, const std::string& help) {
  flags_[name] = Flag{Kind::kStringList, target, help + " (repeatable)", "", {}, {}};
  order_.push_back(name);
}
void FlagSet::Choice(const std::string& name, std::string* target, std::vector<std::string> choices,
                     const std::string& help) {
  flags_[name] = Flag{Kind::kChoice, target, help, *target, std::move(choices), {}};
  order_.push_back(name);
}
void FlagSet::Int(const std::string& name, int64_t* target, const std::string& help, IntRange range) {
  flags_[name] = Flag{Kind::kInt, target, help, std::to_string(*target), {}, range};
  order_.push_back(name);
}
void FlagSet::Double(const std::string& name, double* target, const std::string& help, DoubleRange range) {
  std::ostringstream v;
  v << *target;
  flags_[name] = Flag{Kind::kDouble, target, help, v.str(), {}, {}};
  flags_[name].double_range = range;
  order_.push_back(name);
}
void FlagSet::Bool(const std::string& name, bool* target, const std::string& help) {
  flags_[name] = Flag{Kind::kBool, target, help, *target ? "true" : "false", {}, {}};
  order_.push_back(name);
}

std::string JoinChoices(const std::vector<std::string>& choices) {
  std::string out;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i > 0) out += i + 1 == choices.size() ? " or " : ", ";
    out += choices[i];
  }
  return out;
}

Result<int64_t> ParseIntFlag(const std::string& name, const std::string& value, IntRange range) {
  const std::string got = ", got " + QuoteUntrusted(value);
  // strtoll also skips leading whitespace and takes a '+' ("--port +80"): an integer is
  // digits, with a '-' before them where the range goes below zero, and nothing else.
  const size_t digits = !value.empty() && value[0] == '-' ? 1 : 0;
  if (value.size() == digits || !std::isdigit(static_cast<unsigned char>(value[digits]))) {
    return InvalidArgumentError("flag --" + name + ": expected an integer" + got);
  }
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (*end != '\0') return InvalidArgumentError("flag --" + name + ": expected an integer" + got);
  if (errno == ERANGE || v < range.min || v > range.max) {
    return InvalidArgumentError("flag --" + name + ": expected " + std::to_string(range.min) + " to " +
                                std::to_string(range.max) + got);
  }
  return static_cast<int64_t>(v);
}

Result<double> ParseDecimalFlag(const std::string& name, const std::string& value, DoubleRange range) {
  const std::string got = ", got " + QuoteUntrusted(value);
  // strtod also skips leading whitespace, takes a '+', reads C's hexadecimal floats ("0x10" is
  // 16), nan and inf: a finite decimal number starts with a digit, a '-' or a '.', and has no
  // 'x'.
  const bool decimal_first = !value.empty() && (std::isdigit(static_cast<unsigned char>(value[0])) ||
                                                value[0] == '-' || value[0] == '.');
  char* end = nullptr;
  const double v = decimal_first ? std::strtod(value.c_str(), &end) : 0;
  if (!decimal_first || *end != '\0' || !std::isfinite(v) || value.find_first_of("xX") != std::string::npos) {
    return InvalidArgumentError("flag --" + name + ": expected a finite decimal number" + got);
  }
  if (v < range.min || v > range.max) {
    return InvalidArgumentError("flag --" + name + ": expected " + FormatExact(range.min) + " to " +
                                FormatExact(range.max) + got);
  }
  return v;
}

Result<std::vector<int64_t>> ParseIntListFlag(const std::string& name, const std::string& value, IntRange range) {
  std::vector<int64_t> values;
  size_t start = 0;
  for (;;) {
    const size_t comma = value.find(',', start);
    const std::string item = value.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    auto parsed = ParseIntFlag(name, item, range);
    if (!parsed.ok()) {
      return InvalidArgumentError("flag --" + name + ": expected comma-separated integers from " +
                                  std::to_string(range.min) + " to " + std::to_string(range.max) + ", got " +
                                  QuoteUntrusted(value));
    }
    values.push_back(*parsed);
    if (comma == std::string::npos) return values;
    start = comma + 1;
  }
}

Status FlagSet::Set(const std::string& name, Flag& flag, const std::string& value) {
  const std::string got = ", got " + QuoteUntrusted(value);
  if (value.empty() && (flag.kind == Kind::kStringList || (flag.kind == Kind::kString && !flag.allow_empty))) {
    return InvalidArgumentError("flag --" + name + ": expected a non-empty value, got ''");
  }
  switch (flag.kind) {
    case Kind::kString:
      *static_cast<std::string*>(flag.target) = value;
      return Status::Ok();
    case Kind::kStringList:
      static_cast<std::vector<std::string>*>(flag.target)->push_back(value);
      return Status::Ok();
    case Kind::kChoice:
      for (const auto& choice : flag.choices) {
        if (value == choice) {
          *static_cast<std::string*>(flag.target) = value;
          return Status::Ok();
        }
      }
      return InvalidArgumentError("flag --" + name + ": expected " + JoinChoices(flag.choices) + got);
    case Kind::kInt: {
      ASSIGN_OR_RETURN(*static_cast<int64_t*>(flag.target), ParseIntFlag(name, value, flag.range));
      return Status::Ok();
    }
    case Kind::kDouble: {
      ASSIGN_OR_RETURN(*static_cast<double*>(flag.target), ParseDecimalFlag(name, value, flag.double_range));
      return Status::Ok();
    }
    case Kind::kBool:
      if (value == "true" || value == "1") {
        *static_cast<bool*>(flag.target) = true;
      } else if (value == "false" || value == "0") {
        *static_cast<bool*>(flag.target) = false;
      } else {
        return InvalidArgumentError("flag --" + name + ": expected true or false" + got);
      }
      return Status::Ok();
  }
  return InternalError("unreachable");
}

Status FlagSet::Parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {  // the end of the flags: what follows is positional, dashes or not
      for (++i; i < argc; ++i) positional_.push_back(argv[i]);
      break;
    }
    if (arg == "-h" && flags_.count("help")) arg = "--help";
    // "-o" for a one-letter flag declared as "o".
    if (arg.size() == 2 && arg[0] == '-' && flags_.count(arg.substr(1))) arg = "-" + arg;
    if (arg.size() > 1 && arg[0] == '-' && arg[1] != '-' && !std::isdigit(static_cast<unsigned char>(arg[1])) &&
        arg[1] != '.') {
      // "-x" is a mistyped flag, never an argument: no job id, file or name Tessera takes
      // starts with a dash.
      return InvalidArgumentError("unknown flag " + EscapeUntrusted(arg) + " (flags start with two dashes; see --help)");
    }
    if (arg.rfind("--", 0) != 0) {
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it = flags_.find(name);
    if (it == flags_.end()) return InvalidArgumentError("unknown flag --" + EscapeUntrusted(name) + " (see --help)");
    if (it->second.seen && it->second.kind != Kind::kStringList) {
      return InvalidArgumentError("flag --" + name + " is given twice");
    }
    it->second.seen = true;
    if (!has_value && it->second.kind == Kind::kBool) {
      value = "true";
    } else if (!has_value) {
      if (i + 1 >= argc) return InvalidArgumentError("flag --" + name + " needs a value");
      value = argv[++i];
      // "-o --json": the value forgotten, the next flag taken for it. A value that starts with
      // two dashes goes after '='.
      if (value.rfind("--", 0) == 0) {
        return InvalidArgumentError("flag --" + name + " needs a value, got the flag " + EscapeUntrusted(value) +
                                    " (a value that starts with dashes goes after '=': --" + name + "=VALUE)");
      }
    }
    RETURN_IF_ERROR(Set(name, it->second, value));
  }
  return Status::Ok();
}

Status FlagSet::ParseFlagsOnly(int argc, char** argv, int first) {
  RETURN_IF_ERROR(Parse(argc, argv, first));
  if (positional_.empty()) return Status::Ok();
  const std::string& word = positional_.front();
  std::string hint = " (flags only; see --help)";
  if (word == "true" || word == "false" || word == "0" || word == "1") {
    hint = " (a boolean flag takes its value after '=': --FLAG=" + word + ")";
  }
  return InvalidArgumentError("unexpected argument " + QuoteUntrusted(word) + hint);
}

std::vector<std::string> FlagSet::Given() const {
  std::vector<std::string> given;
  for (const auto& [name, flag] : flags_) {
    if (flag.seen) given.push_back(name);
  }
  return given;
}

bool FlagSet::WasGiven(const std::string& name) const {
  auto it = flags_.find(name);
  return it != flags_.end() && it->second.seen;
}

std::string FlagSet::Usage() const { return Usage(order_); }

std::string FlagSet::Usage(const std::vector<std::string>& only) const {
  std::ostringstream out;
  for (const auto& name : only) {
    auto found = flags_.find(name);
    if (found == flags_.end()) continue;
    const Flag& f = found->second;
    // A one-letter flag is shown as it is usually typed, with one dash ("-o VALUE").
    std::string left = (name.size() == 1 ? "  -" : "  --") + name + (f.kind == Kind::kBool ? "" : " VALUE");
    out << left;
    for (size_t i = left.size(); i < 30; ++i) out << ' ';
    if (left.size() >= 30) out << "  ";  // a long name still gets a gap before its help
    out << f.help;
    if (f.kind == Kind::kChoice) out << " (" << JoinChoices(f.choices) << ")";
    if (f.kind == Kind::kInt && (f.range.min != IntRange().min || f.range.max != IntRange().max)) {
      out << " (" << f.range.min << " to " << f.range.max << ")";
    }
    if (f.kind == Kind::kDouble &&
        (f.double_range.min != DoubleRange().min || f.double_range.max != DoubleRange().max)) {
      out << " (" << FormatExact(f.double_range.min) << " to " << FormatExact(f.double_range.max) << ")";
    }
    // A default outside an integer's range means "not given" (a sentinel): not shown.
    bool shown = !f.default_value.empty() && f.kind != Kind::kBool;
    if (shown && f.kind == Kind::kInt) {
      const long long value = std::strtoll(f.default_value.c_str(), nullptr, 10);
      shown = value >= f.range.min && value <= f.range.max;
    }
    if (shown) out << " (default: " << f.default_value << ")";
    out << '\n';
  }
  return out.str();
}

Status RefuseDirectory(const std::string& named, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return InvalidArgumentError(named + ": expected a file, got a directory");
  }
  return Status::Ok();
}

Status CheckDirectory(const std::string& named, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return InvalidArgumentError(named + ": cannot read it (" + std::strerror(errno) + ")");
  }
  if (!S_ISDIR(st.st_mode)) return InvalidArgumentError(named + ": expected a directory, got a file");
  return Status::Ok();
}

Result<std::string> ReadSecretFile(const std::string& flag, const std::string& path) {
  constexpr size_t kMaxSecretBytes = 1024;
  RETURN_IF_ERROR(RefuseDirectory("--" + flag + " " + QuoteUntrusted(path, 256), path));
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgumentError("--" + flag + " " + QuoteUntrusted(path, 256) + ": cannot read it");
  std::string line;
  char c = 0;
  while (line.size() <= kMaxSecretBytes && in.get(c) && c != '\n') line += c;
  if (line.size() > kMaxSecretBytes) {
    return InvalidArgumentError("--" + flag + " " + QuoteUntrusted(path, 256) + ": expected a secret of at most " +
                                std::to_string(kMaxSecretBytes) + " bytes on its first line, got more");
  }
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  if (line.empty()) return InvalidArgumentError("--" + flag + " " + QuoteUntrusted(path, 256) + ": its first line is empty");
  return line;
}

}  // namespace tessera
