// The mapping machinery the ecosystem's readers share (core/config/ecosystem.cpp: FSDP and accelerate's
// YAML; core/config/deepspeed_config.cpp: DeepSpeed's JSON): a Mapper collects what each field became, and a
// Table of Handlers walks a file's fields, refusing the ones it does not know. Internal to those two files.
#pragma once
#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "core/config/ecosystem.h"
#include "core/util/error.h"

namespace distlab::ecosystem {

using json = nlohmann::ordered_json;

std::string show_json(const json& v);
std::string toml_value(const json& v);  // a value as the TOML config would read it

struct Mapper {
  EcosystemConfig out;

  std::string where(const std::string& field) const { return fmt::format("{}: {}", out.file, field); }
  [[noreturn]] void unsupported(const std::string& field, const json& v, const std::string& why, const std::string& hint) const {
    throw ConfigError(fmt::format("{} = {} is not supported: {}", where(field), show_json(v), why), hint);
  }
  void set(const std::string& field, const json& v, const std::string& key, const std::string& value) {
    out.fields.push_back({field, show_json(v), key, value});
    out.settings.push_back({key, value, where(field)});
  }
  void note(const std::string& field, const json& v, const std::string& text) { out.fields.push_back({field, show_json(v), "", text}); }
  bool is_auto(const std::string& field, const json& v) {
    if (!(v.is_string() && v.get<std::string>() == "auto")) return false;
    note(field, v, "auto: the TOML config's value stays");
    return true;
  }
  double number(const std::string& field, const json& v) const {
    if (!v.is_number()) throw ConfigError(fmt::format("{} = {} is not a number", where(field), show_json(v)));
    return v.get<double>();
  }
  int64_t integer(const std::string& field, const json& v) const {
    const double d = number(field, v);
    if (d != std::floor(d) || std::abs(d) > 1e15) throw ConfigError(fmt::format("{} = {} is not a whole number", where(field), show_json(v)));
    return int64_t(d);
  }
  bool boolean(const std::string& field, const json& v) const {
    if (v.is_boolean()) return v.get<bool>();
    if (v.is_string() && (v == "true" || v == "false")) return v == "true";
    throw ConfigError(fmt::format("{} = {} is not true or false", where(field), show_json(v)));
  }
  std::string text(const std::string& field, const json& v) const {
    if (!v.is_string()) throw ConfigError(fmt::format("{} = {} is not a string", where(field), show_json(v)));
    return v.get<std::string>();
  }
};

using Handler = std::function<void(Mapper&, const std::string& field, const json& v)>;
using Table = std::map<std::string, Handler>;

// Walks `obj`: each key must be in `table` (a nested object is walked by its own table, given as the key
// "name." with a handler that receives the object).
void walk_json(Mapper& m, const json& obj, const Table& table, const std::string& prefix);
// A field that sets `key` (its value converted, or as TOML reads it); "auto" leaves the key to the TOML
Handler to_key(const std::string& key, std::function<std::string(Mapper&, const std::string&, const json&)> convert = nullptr);
// A field distlab has no key for: the note says how distlab behaves instead
Handler note_only(const std::string& text);
std::string as_int(Mapper& m, const std::string& f, const json& v);
std::string as_real(Mapper& m, const std::string& f, const json& v);
std::string as_bool(Mapper& m, const std::string& f, const json& v);
// A config file of at most 1 MiB, read and handed to `map` (errors name `what` and the path)
EcosystemConfig read_file(const std::string& path, const std::string& what, EcosystemConfig (*map)(const std::string&, const std::string&));

}  // namespace distlab::ecosystem
