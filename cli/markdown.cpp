// render_markdown (cli/markdown.h): the subset of Markdown the chapters use, line by line.
#include "cli/markdown.h"

#include <algorithm>
#include <sstream>
#include <vector>

namespace distlab {

namespace {

struct Style {
  bool ansi;
  std::string on(const char* code) const { return ansi ? std::string("\033[") + code + "m" : ""; }
  std::string off() const { return ansi ? "\033[0m" : ""; }
};

// What a terminal shows of a string: UTF-8 code points (each one column: the chapters' symbols are), and
// nothing of an ANSI sequence.
size_t columns(const std::string& s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i++) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == 0x1b) {  // ESC [ ... m
      while (i < s.size() && s[i] != 'm') i++;
      continue;
    }
    if ((c & 0xC0) != 0x80) n++;
  }
  return n;
}

// **bold**, *em* / _em_, `code`, [text](url), ![alt](src): spans within one line.
std::string inline_spans(const std::string& s, const Style& st) {
  std::string o;
  for (size_t i = 0; i < s.size();) {
    if (s[i] == '`') {
      const size_t e = s.find('`', i + 1);
      if (e != std::string::npos) {
        o += st.on("36") + s.substr(i + 1, e - i - 1) + st.off();
        i = e + 1;
        continue;
      }
    }
    if (s.compare(i, 2, "**") == 0) {
      const size_t e = s.find("**", i + 2);
      if (e != std::string::npos) {
        o += st.on("1") + inline_spans(s.substr(i + 2, e - i - 2), st) + st.off();
        i = e + 2;
        continue;
      }
    }
    if ((s[i] == '*' || s[i] == '_') && i + 1 < s.size() && s[i + 1] != ' ' && (i == 0 || !std::isalnum(static_cast<unsigned char>(s[i - 1])))) {
      const size_t e = s.find(s[i], i + 1);
      if (e != std::string::npos && e > i + 1 && s[e - 1] != ' ' && (e + 1 >= s.size() || !std::isalnum(static_cast<unsigned char>(s[e + 1])))) {
        o += st.on("3") + inline_spans(s.substr(i + 1, e - i - 1), st) + st.off();
        i = e + 1;
        continue;
      }
    }
    const bool image = s.compare(i, 2, "![") == 0;
    if (s[i] == '[' || image) {
      const size_t open = i + (image ? 1 : 0);
      const size_t close = s.find("](", open);
      const size_t end = close == std::string::npos ? std::string::npos : s.find(')', close + 2);
      if (close != std::string::npos && end != std::string::npos && s.find('\n', open) > end) {
        const std::string text = inline_spans(s.substr(open + 1, close - open - 1), st), url = s.substr(close + 2, end - close - 2);
        o += image ? "[figure: " + text + "] (" + url + ")" : text + (url.rfind('#', 0) == 0 ? "" : " (" + st.on("4") + url + st.off() + ")");
        i = end + 1;
        continue;
      }
    }
    o += s[i++];
  }
  return o;
}

std::vector<std::string> table_cells(const std::string& line) {
  std::vector<std::string> cells;
  std::string cur;
  bool code = false;
  for (size_t i = 0; i < line.size(); i++) {
    const char c = line[i];
    if (c == '`') code = !code;
    if (c == '\\' && i + 1 < line.size() && line[i + 1] == '|') {
      cur += '|';
      i++;
    } else if (c == '|' && !code) {
      cells.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  cells.push_back(cur);
  if (!cells.empty() && cells.front().find_first_not_of(' ') == std::string::npos) cells.erase(cells.begin());
  if (!cells.empty() && cells.back().find_first_not_of(' ') == std::string::npos) cells.pop_back();
  for (auto& c : cells) {
    const size_t a = c.find_first_not_of(' '), b = c.find_last_not_of(' ');
    c = a == std::string::npos ? "" : c.substr(a, b - a + 1);
  }
  return cells;
}

bool separator_row(const std::vector<std::string>& cells) {
  for (const auto& c : cells)
    if (c.empty() || c.find_first_not_of(":-") != std::string::npos) return false;
  return !cells.empty();
}

std::string render_table(const std::vector<std::string>& lines, const Style& st) {
  std::vector<std::vector<std::string>> rows;
  bool header = false;
  for (const auto& l : lines) {
    auto cells = table_cells(l);
    if (separator_row(cells)) {
      header = rows.size() == 1;
      continue;
    }
    for (auto& c : cells) c = inline_spans(c, st);
    rows.push_back(cells);
  }
  std::vector<size_t> width;
  for (const auto& r : rows)
    for (size_t k = 0; k < r.size(); k++) {
      if (width.size() <= k) width.push_back(0);
      width[k] = std::max(width[k], columns(r[k]));
    }
  std::string o;
  for (size_t i = 0; i < rows.size(); i++) {
    std::string line = "  ";
    for (size_t k = 0; k < rows[i].size(); k++) {
      const std::string cell = i == 0 && header ? st.on("1") + rows[i][k] + st.off() : rows[i][k];
      line += cell + (k + 1 < rows[i].size() ? std::string(width[k] - columns(rows[i][k]) + 2, ' ') : "");
    }
    o += line + "\n";
    if (i == 0 && header) {
      size_t total = 0;
      for (size_t k = 0; k < width.size(); k++) total += width[k] + (k + 1 < width.size() ? 2 : 0);
      std::string rule;
      for (size_t k = 0; k < total; k++) rule += st.ansi ? "─" : "-";
      o += "  " + rule + "\n";
    }
  }
  return o;
}

}  // namespace

std::string render_markdown(const std::string& md, bool ansi) {
  const Style st{ansi};
  std::istringstream in(md);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  std::string o;
  for (size_t i = 0; i < lines.size(); i++) {
    const std::string& l = lines[i];
    if (l.rfind("```", 0) == 0) {  // a fenced block: kept as it is, indented
      for (i++; i < lines.size() && lines[i].rfind("```", 0) != 0; i++) o += "    " + st.on("2") + lines[i] + st.off() + "\n";
      continue;
    }
    if (l.rfind("|", 0) == 0) {  // a table: its rows together
      std::vector<std::string> rows;
      for (; i < lines.size() && lines[i].rfind("|", 0) == 0; i++) rows.push_back(lines[i]);
      i--;
      o += render_table(rows, st);
      continue;
    }
    size_t level = 0;
    while (level < l.size() && l[level] == '#') level++;
    if (level > 0 && level < l.size() && l[level] == ' ') {
      const std::string text = inline_spans(l.substr(level + 1), st);
      if (ansi) o += st.on(level == 1 ? "1;4" : "1") + text + st.off() + "\n";
      else o += text + "\n" + (level <= 2 ? std::string(columns(text), level == 1 ? '=' : '-') + "\n" : "");
      continue;
    }
    const size_t indent = l.find_first_not_of(' ');
    if (indent != std::string::npos && l.compare(indent, 2, "- ") == 0) {
      o += l.substr(0, indent) + (ansi ? "• " : "- ") + inline_spans(l.substr(indent + 2), st) + "\n";
      continue;
    }
    if (l.rfind("> ", 0) == 0) {
      o += (ansi ? "│ " : "| ") + inline_spans(l.substr(2), st) + "\n";
      continue;
    }
    o += inline_spans(l, st) + "\n";
  }
  return o;
}

}  // namespace distlab
