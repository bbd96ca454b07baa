// The job.toml reader's tools, shared by job_spec.cc (the top level, [model], [data], [train])
// and job_spec_tables.cc (the optional [server], [aggregation], [compression], [selection] and
// [async] tables). Internal to tessera_job_spec.
#pragma once

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "base/escape.h"
#include "base/format.h"
#include "base/status.h"
#include "tessera/v1/job.pb.h"

namespace tessera::job_spec_internal {

inline std::string JoinQuoted(std::span<const std::string_view> names) {
  std::string out;
  for (std::string_view name : names) {
    if (!out.empty()) out += ", ";
    out += '"';
    out += name;
    out += '"';
  }
  return out;
}

inline std::string_view TypeName(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

inline std::string Dotted(std::string_view prefix, std::string_view key) {
  return prefix.empty() ? std::string(key) : std::string(prefix) + "." + std::string(key);
}

// Reads typed values out of the parsed document and remembers where each key was, so that
// checks made after reading still point at the line.
class SpecReader {
 public:
  explicit SpecReader(std::string_view source) : source_(source) {}

  // "job.toml:12:3" for a key that was read, "job.toml" for one left at its default.
  std::string Where(const std::string& dotted) const {
    auto it = positions_.find(dotted);
    if (it == positions_.end()) return source_;
    return At(it->second);
  }
  std::string At(const toml::source_position& pos) const {
    return source_ + ":" + std::to_string(pos.line) + ":" + std::to_string(pos.column);
  }
  bool Present(const std::string& dotted) const { return positions_.count(dotted) > 0; }
  // Whether `table` has `key`, remembering where it is.
  bool Has(const toml::table& table, std::string_view prefix, std::string_view key) {
    return Locate(table, prefix, key) != nullptr;
  }

  Status Error(const std::string& dotted, const std::string& message) const {
    return InvalidArgumentError(Where(dotted) + ": key '" + dotted + "': " + message);
  }

  Status CheckKeys(const toml::table& table, std::string_view prefix,
                   std::span<const std::string_view> allowed) const {
    for (auto&& [key, node] : table) {
      if (std::find(allowed.begin(), allowed.end(), key.str()) != allowed.end()) continue;
      std::string where = key.source().begin ? At(key.source().begin) : At(node.source().begin);
      std::string table_name = prefix.empty() ? "the top level" : "[" + std::string(prefix) + "]";
      std::string allowed_list;
      for (std::string_view name : allowed) allowed_list += (allowed_list.empty() ? "" : ", ") + std::string(name);
      return InvalidArgumentError(where + ": unknown key '" + EscapeUntrusted(Dotted(prefix, key.str()), 128) +
                                  "'; allowed keys in " + table_name + ": " + allowed_list);
    }
    return Status::Ok();
  }

  // The sub-table `key`, nullptr when absent.
  Result<const toml::table*> Table(const toml::table& parent, std::string_view prefix, std::string_view key) {
    const toml::node* node = Locate(parent, prefix, key);
    if (node == nullptr) return static_cast<const toml::table*>(nullptr);
    if (!node->is_table()) return TypeError(prefix, key, *node, "a table");
    return node->as_table();
  }

  Status String(const toml::table& table, std::string_view prefix, std::string_view key, std::string* out) {
    const toml::node* node = Locate(table, prefix, key);
    if (node == nullptr) return Status::Ok();
    if (!node->is_string()) return TypeError(prefix, key, *node, "a string");
    *out = node->as_string()->get();
    return Status::Ok();
  }

  // An integer in [min, max].
  Status Unsigned(const toml::table& table, std::string_view prefix, std::string_view key, uint64_t min,
                  uint64_t max, uint64_t* out) {
    const toml::node* node = Locate(table, prefix, key);
    if (node == nullptr) return Status::Ok();
    if (!node->is_integer()) return TypeError(prefix, key, *node, "an integer");
    return CheckedUnsigned(Dotted(prefix, key), node->as_integer()->get(), min, max, out);
  }

  // A float; an integer is accepted too.
  Status Number(const toml::table& table, std::string_view prefix, std::string_view key, double* out) {
    const toml::node* node = Locate(table, prefix, key);
    if (node == nullptr) return Status::Ok();
    if (node->is_floating_point()) {
      *out = node->as_floating_point()->get();
    } else if (node->is_integer()) {
      *out = static_cast<double>(node->as_integer()->get());
    } else {
      return TypeError(prefix, key, *node, "a float");
    }
    if (!std::isfinite(*out)) return Error(Dotted(prefix, key), "expected a finite number, found " + FormatExact(*out));
    return Status::Ok();
  }

  Status Bool(const toml::table& table, std::string_view prefix, std::string_view key, bool* out) {
    const toml::node* node = Locate(table, prefix, key);
    if (node == nullptr) return Status::Ok();
    if (!node->is_boolean()) return TypeError(prefix, key, *node, "true or false");
    *out = node->as_boolean()->get();
    return Status::Ok();
  }

  // An array of at most `max_size` finite numbers (integers accepted).
  Status NumberArray(const toml::table& table, std::string_view prefix, std::string_view key, size_t max_size,
                     std::vector<double>* out) {
    const toml::node* node = Locate(table, prefix, key);
    if (node == nullptr) return Status::Ok();
    if (!node->is_array()) return TypeError(prefix, key, *node, "an array of numbers");
    const toml::array& array = *node->as_array();
    if (array.size() > max_size) {
      return Error(Dotted(prefix, key), "must have at most " + std::to_string(max_size) + " values, got " +
                                            std::to_string(array.size()));
    }
    out->clear();
    for (size_t i = 0; i < array.size(); ++i) {
      const toml::node& element = array[i];
      const std::string dotted = Dotted(prefix, key) + "[" + std::to_string(i) + "]";
      positions_[dotted] = element.source().begin;
      double value = 0;
      if (element.is_floating_point()) {
        value = element.as_floating_point()->get();
      } else if (element.is_integer()) {
        value = static_cast<double>(element.as_integer()->get());
      } else {
        return InvalidArgumentError(Where(dotted) + ": key '" + dotted + "': expected a number, found " +
                                    std::string(TypeName(element)));
      }
      if (!std::isfinite(value)) return Error(dotted, "expected a finite number, found " + FormatExact(value));
      out->push_back(value);
    }
    return Status::Ok();
  }

  // An array of integers, each in [min, max].
  Status UnsignedArray(const toml::table& table, std::string_view prefix, std::string_view key, uint64_t min,
                       uint64_t max, std::vector<uint64_t>* out) {
    const toml::node* node = Locate(table, prefix, key);
    if (node == nullptr) return Status::Ok();
    if (!node->is_array()) return TypeError(prefix, key, *node, "an array of integers");
    out->clear();
    const toml::array& array = *node->as_array();
    for (size_t i = 0; i < array.size(); ++i) {
      const toml::node& element = array[i];
      const std::string dotted = Dotted(prefix, key) + "[" + std::to_string(i) + "]";
      positions_[dotted] = element.source().begin;
      if (!element.is_integer()) {
        return InvalidArgumentError(Where(dotted) + ": key '" + dotted + "': expected an integer, found " +
                                    std::string(TypeName(element)));
      }
      uint64_t value = 0;
      RETURN_IF_ERROR(CheckedUnsigned(dotted, element.as_integer()->get(), min, max, &value));
      out->push_back(value);
    }
    return Status::Ok();
  }

  // An array of at most `max_size` arrays of integers, each integer in [min, max].
  Status UnsignedArrays(const toml::table& table, std::string_view prefix, std::string_view key, size_t max_size,
                        uint64_t min, uint64_t max, std::vector<std::vector<uint64_t>>* out) {
    const toml::node* node = Locate(table, prefix, key);
    if (node == nullptr) return Status::Ok();
    if (!node->is_array()) return TypeError(prefix, key, *node, "an array of arrays of integers");
    const toml::array& array = *node->as_array();
    if (array.size() > max_size) {
      return Error(Dotted(prefix, key), "must have at most " + std::to_string(max_size) + " arrays, got " +
                                            std::to_string(array.size()));
    }
    out->assign(array.size(), {});
    for (size_t i = 0; i < array.size(); ++i) {
      const std::string dotted = Dotted(prefix, key) + "[" + std::to_string(i) + "]";
      positions_[dotted] = array[i].source().begin;
      if (!array[i].is_array()) {
        return InvalidArgumentError(Where(dotted) + ": key '" + dotted + "': expected an array of integers, found " +
                                    std::string(TypeName(array[i])));
      }
      const toml::array& inner = *array[i].as_array();
      const uint64_t max_count = min > max ? 0 : (max - min == UINT64_MAX ? UINT64_MAX : max - min + 1);
      if (inner.size() > max_count) {
        return Error(dotted, "must have at most " + std::to_string(max_count) + " values, got " +
                                 std::to_string(inner.size()));
      }
      for (size_t j = 0; j < inner.size(); ++j) {
        const std::string element = dotted + "[" + std::to_string(j) + "]";
        positions_[element] = inner[j].source().begin;
        if (!inner[j].is_integer()) {
          return InvalidArgumentError(Where(element) + ": key '" + element + "': expected an integer, found " +
                                      std::string(TypeName(inner[j])));
        }
        uint64_t value = 0;
        RETURN_IF_ERROR(CheckedUnsigned(element, inner[j].as_integer()->get(), min, max, &value));
        (*out)[i].push_back(value);
      }
    }
    return Status::Ok();
  }

 private:
  const toml::node* Locate(const toml::table& table, std::string_view prefix, std::string_view key) {
    const toml::node* node = table.get(key);
    if (node != nullptr) positions_[Dotted(prefix, key)] = node->source().begin;
    return node;
  }

  Status TypeError(std::string_view prefix, std::string_view key, const toml::node& node,
                   std::string_view expected) const {
    return Error(Dotted(prefix, key),
                 "expected " + std::string(expected) + ", found " + std::string(TypeName(node)));
  }

  Status CheckedUnsigned(const std::string& dotted, int64_t value, uint64_t min, uint64_t max, uint64_t* out) const {
    if (value < 0 || static_cast<uint64_t>(value) < min) {
      return Error(dotted, "must be at least " + std::to_string(min) + ", got " + std::to_string(value));
    }
    if (static_cast<uint64_t>(value) > max) {
      return Error(dotted, "must be at most " + std::to_string(max) + ", got " + std::to_string(value));
    }
    *out = static_cast<uint64_t>(value);
    return Status::Ok();
  }

  std::string source_;
  std::map<std::string, toml::source_position> positions_;
};

inline Status CheckOneOf(const SpecReader& reader, const std::string& dotted, const std::string& value,
                  std::span<const std::string_view> allowed) {
  if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) return Status::Ok();
  return reader.Error(dotted, "expected one of " + JoinQuoted(allowed) + ", found \"" + EscapeUntrusted(value) + "\"");
}

// A string key of at most `max_bytes` bytes without control characters (docs/JOBS.md), as the
// coordinator's ValidateJobSpec requires; the message gives the size, never the value.
inline Status CheckPlainText(const SpecReader& reader, const std::string& dotted, const std::string& value,
                      size_t max_bytes) {
  const bool control = HasHiddenCharacters(value);
  if (value.size() <= max_bytes && !control) return Status::Ok();
  return reader.Error(dotted, "expected at most " + std::to_string(max_bytes) + " bytes without control characters, found " +
                                  (control ? "a control or hidden character" : std::to_string(value.size()) + " bytes"));
}

inline std::string Lowercase(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// The optional tables, each read into `spec` once the top level, the model and the data are in
// it; each refuses its keys where the strategy or mode does not use them.
Status ReadServer(const toml::table& root, SpecReader& reader, v1::JobSpec* spec);
Status ReadAggregation(const toml::table& root, SpecReader& reader, v1::JobSpec* spec);
Status ReadCompression(const toml::table& root, SpecReader& reader, v1::JobSpec* spec);
Status ReadSelection(const toml::table& root, SpecReader& reader, v1::JobSpec* spec);
Status ReadAsync(const toml::table& root, SpecReader& reader, v1::JobSpec* spec);

}  // namespace tessera::job_spec_internal
