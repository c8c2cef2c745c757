// The YAML subset of config files (core/config/yaml_subset.h).
#include "core/config/yaml_subset.h"

#include <fmt/format.h>

#include <cmath>
#include <sstream>

#include "core/util/error.h"

namespace distlab {

using json = nlohmann::ordered_json;

namespace {

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// A '#' that starts a comment: at the start, or after a space, outside quotes.
std::string strip_comment(const std::string& s) {
  char quote = 0;
  for (size_t i = 0; i < s.size(); i++) {
    const char c = s[i];
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#' && (i == 0 || s[i - 1] == ' ' || s[i - 1] == '\t')) {
      return s.substr(0, i);
    }
  }
  return s;
}

json yaml_scalar(const std::string& raw, const std::string& where) {
  const std::string s = trim(raw);
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
  if (s.size() >= 2 && (s[0] == '"' || s[0] == '\'')) {
    if (s.back() != s[0]) throw ConfigError(fmt::format("{}: an unterminated quoted string", where));
    return s.substr(1, s.size() - 2);
  }
  if (s[0] == '&' || s[0] == '*' || s[0] == '!' || s[0] == '|' || s[0] == '>')
    throw ConfigError(fmt::format("{}: '{}' uses YAML anchors, tags or block scalars", where, s),
                      "config files here are plain key: value mappings; write the value out");
  if (s[0] == '{') {
    if (trim(s.substr(1, s.size() - 2)).empty() && s.back() == '}') return json::object();
    throw ConfigError(fmt::format("{}: a flow mapping {{...}}", where), "write it as an indented block, one key per line");
  }
  if (s[0] == '[') {
    if (s.back() != ']') throw ConfigError(fmt::format("{}: an unterminated list", where));
    json a = json::array();
    std::stringstream ss(s.substr(1, s.size() - 2));
    for (std::string item; std::getline(ss, item, ',');)
      if (!trim(item).empty()) a.push_back(yaml_scalar(item, where));
    return a;
  }
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  char* end = nullptr;
  const long long i = std::strtoll(s.c_str(), &end, 10);
  if (*end == 0) return int64_t(i);
  const double d = std::strtod(s.c_str(), &end);
  if (*end == 0 && std::isfinite(d)) return d;
  return s;
}

struct YamlLine {
  int no, indent;
  std::string text;  // without indentation and comment
};

json yaml_block(const std::vector<YamlLine>& lines, size_t& i, int indent, const std::string& name) {
  auto where = [&](const YamlLine& l) { return fmt::format("{}:{}", name, l.no); };
  if (lines[i].text.rfind("- ", 0) == 0 || lines[i].text == "-") {
    json a = json::array();
    while (i < lines.size() && lines[i].indent == indent && (lines[i].text.rfind("- ", 0) == 0 || lines[i].text == "-")) {
      const std::string item = trim(lines[i].text.substr(1));
      if (item.find(": ") != std::string::npos || (!item.empty() && item.back() == ':'))
        throw ConfigError(fmt::format("{}: a list of mappings", where(lines[i])), "this reader takes lists of plain values");
      a.push_back(yaml_scalar(item, where(lines[i])));
      i++;
    }
    return a;
  }
  json m = json::object();
  while (i < lines.size() && lines[i].indent == indent) {
    const YamlLine& l = lines[i];
    size_t colon = std::string::npos;
    char quote = 0;
    for (size_t k = 0; k < l.text.size(); k++) {
      if (quote) {
        if (l.text[k] == quote) quote = 0;
      } else if (l.text[k] == '"' || l.text[k] == '\'') {
        quote = l.text[k];
      } else if (l.text[k] == ':' && (k + 1 == l.text.size() || l.text[k + 1] == ' ')) {
        colon = k;
        break;
      }
    }
    if (colon == std::string::npos) throw ConfigError(fmt::format("{}: '{}' is not a key: value line", where(l), l.text));
    std::string key = trim(l.text.substr(0, colon));
    if (key.size() >= 2 && (key[0] == '"' || key[0] == '\'')) key = key.substr(1, key.size() - 2);
    if (m.contains(key)) throw ConfigError(fmt::format("{}: '{}' appears twice", where(l), key));
    const std::string rest = trim(l.text.substr(colon + 1));
    i++;
    if (!rest.empty()) {
      m[key] = yaml_scalar(rest, where(l));
    } else if (i < lines.size() && lines[i].indent > indent) {
      m[key] = yaml_block(lines, i, lines[i].indent, name);
    } else if (i < lines.size() && lines[i].indent == indent && lines[i].text.rfind("- ", 0) == 0) {
      m[key] = yaml_block(lines, i, indent, name);  // a list at the key's own indentation
    } else {
      m[key] = nullptr;
    }
  }
  if (i < lines.size() && lines[i].indent > indent)
    throw ConfigError(fmt::format("{}:{}: indented more than the lines before it", name, lines[i].no), "align the keys of one mapping");
  return m;
}

}  // namespace

json parse_yaml_subset(const std::string& text, const std::string& name) {
  std::vector<YamlLine> lines;
  std::stringstream ss(text);
  int no = 0;
  for (std::string line; std::getline(ss, line);) {
    no++;
    if (line.find('\t') != std::string::npos && trim(strip_comment(line)).size() > 0 &&
        line.find_first_not_of(" \t") != line.find_first_not_of(' '))
      throw ConfigError(fmt::format("{}:{}: a tab in the indentation", name, no), "YAML indents with spaces");
    const std::string body = strip_comment(line);
    if (trim(body).empty() || trim(body) == "---") continue;
    const int indent = int(body.find_first_not_of(' '));
    lines.push_back({no, indent, trim(body)});
  }
  if (lines.empty()) return json::object();
  size_t i = 0;
  json doc = yaml_block(lines, i, lines[0].indent, name);
  if (i < lines.size()) throw ConfigError(fmt::format("{}:{}: indented less than the first line", name, lines[i].no));
  return doc;
}

}  // namespace distlab
