// The course's coverage map, chapters/COVERAGE.md: every item of the two seed texts has a row saying where
// it is taught (a chapter) and where it is checked (a quiz question, a lab check, a test), and every
// reference in it resolves. Where the seed texts are at hand (../shared/seeds beside the repository, or
// $DISTLAB_SEEDS), each row's quote must be in them and every bullet and numbered item of them must be
// quoted by some row.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, sep);) v.push_back(trim(x));
  return v;
}

// Whitespace removed: the seeds wrap and space their lines in their own ways.
std::string squeeze(const std::string& s) {
  std::string o;
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') o += c;
  return o;
}

struct Row {
  int line;
  std::string id, seed, item, taught, checked;
};

std::vector<Row> coverage_rows(const fs::path& file, std::vector<int>& malformed) {
  std::vector<Row> rows;
  std::ifstream in(file);
  int no = 0;
  for (std::string line; std::getline(in, line);) {
    no++;
    if (line.rfind("| ", 0) != 0) continue;
    std::vector<std::string> cells;
    size_t at = 1;
    for (size_t bar = line.find(" | ", at); bar != std::string::npos; bar = line.find(" | ", at)) {  // cells never hold " | "
      cells.push_back(trim(line.substr(at, bar - at)));
      at = bar + 2;
    }
    cells.push_back(trim(line.substr(at, line.rfind('|') - at)));
    if (cells[0] == "id" || cells[0].rfind("---", 0) == 0) continue;
    if (cells.size() != 5) {  // a cell holding " | " (or a cell too few): the row would go unchecked
      malformed.push_back(no);
      continue;
    }
    rows.push_back({no, cells[0], cells[1], cells[2], cells[3], cells[4]});
  }
  return rows;
}

// Whether a reference names something that exists: a file (with an optional #anchor), "quiz N:question",
// "lab NN:check", or test "part of a TEST_CASE's name".
std::string resolve(const std::string& ref) {
  const fs::path src = DISTLAB_SOURCE_DIR;
  if (ref.rfind("quiz ", 0) == 0) {
    const size_t colon = ref.find(':');
    if (colon == std::string::npos) return "a quiz reference is 'quiz N:question-id'";
    const std::string id = ref.substr(5, colon - 5), q = ref.substr(colon + 1);
    for (const auto& e : fs::directory_iterator(src / "chapters")) {
      const std::string name = e.path().filename().string();
      if (name.size() < 11 || name.substr(name.size() - 10) != ".quiz.toml") continue;
      std::string num = name.substr(0, name.find('-'));
      while (num.size() > 1 && num[0] == '0') num.erase(0, 1);
      if (num == id) return read_text(e.path()).find("id = \"" + q + "\"") != std::string::npos ? "" : "quiz " + id + " has no question '" + q + "'";
    }
    return "no quiz " + id;
  }
  if (ref.rfind("lab ", 0) == 0) {
    const size_t colon = ref.find(':');
    if (colon == std::string::npos) return "a lab reference is 'lab NN:check_name'";
    const std::string id = ref.substr(4, colon - 4), check = ref.substr(colon + 1);
    for (const auto& e : fs::directory_iterator(src / "labs"))
      if (e.path().filename().string().rfind(id + "-", 0) == 0)
        return read_text(e.path() / "lab.toml").find("name = \"" + check + "\"") != std::string::npos ? "" : "lab " + id + " has no check '" + check + "'";
    return "no lab " + id;
  }
  if (ref.rfind("test \"", 0) == 0 && ref.back() == '"') {
    const std::string part = ref.substr(6, ref.size() - 7);
    for (const auto& e : fs::directory_iterator(src / "tests"))
      if (e.path().extension() == ".cpp" && read_text(e.path()).find(part) != std::string::npos) return "";
    return "no test holds \"" + part + "\"";
  }
  const std::string path = ref.substr(0, ref.find('#'));
  if (path.find('/') != std::string::npos) return fs::exists(src / path) ? "" : path + " does not exist";
  return "not a reference (a path, quiz N:id, lab NN:check, or test \"...\")";
}

}  // namespace

TEST_CASE("chapters/COVERAGE.md: every seed item is taught or checked, every reference resolves, every bullet of the seeds is quoted", "[course]") {
  const fs::path file = fs::path(DISTLAB_SOURCE_DIR) / "chapters" / "COVERAGE.md";
  REQUIRE(fs::exists(file));
  std::vector<int> malformed;
  const std::vector<Row> rows = coverage_rows(file, malformed);
  INFO("COVERAGE.md lines that are not five cells: " << malformed.size());
  CHECK(malformed.empty());
  CHECK(rows.size() >= 60);
  std::set<std::string> ids;
  for (const Row& r : rows) {
    INFO("COVERAGE.md:" << r.line << " (" << r.id << ")");
    CHECK(ids.insert(r.id).second);
    CHECK(r.seed.find("「") != std::string::npos);
    CHECK(!r.item.empty());
    int refs = 0;
    for (const std::string& column : {r.taught, r.checked})
      for (const std::string& ref : split(column, ',')) {
        if (ref.empty() || ref == "-") continue;
        INFO(ref);
        CHECK(resolve(ref) == "");
        refs++;
      }
    CHECK(refs >= 1);  // taught somewhere or checked somewhere: an item with neither has no home
  }
  // With the seed texts at hand: each quote is theirs, and each of their bullets and numbered items is quoted.
  const char* env = std::getenv("DISTLAB_SEEDS");
  const fs::path seeds = env && *env ? fs::path(env) : fs::path(DISTLAB_SOURCE_DIR).parent_path() / "shared" / "seeds";
  if (!fs::is_directory(seeds)) return;  // a clone without the course texts beside it: the map's own checks above
  std::string all;
  std::vector<std::string> items;
  for (const auto& e : fs::directory_iterator(seeds)) {
    const std::string text = read_text(e.path());
    all += squeeze(text);
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      const std::string t = trim(line);
      const bool bullet = t.rfind("•", 0) == 0;
      const bool numbered = t.size() > 3 && std::isdigit(static_cast<unsigned char>(t[0])) && t[1] == '.' && t[2] == ' ';
      if (bullet || numbered) items.push_back(squeeze(t));
    }
  }
  std::vector<std::string> quotes;
  for (const Row& r : rows)
    for (size_t a = r.seed.find("「"); a != std::string::npos; a = r.seed.find("「", a + 1)) {
      const size_t b = r.seed.find("」", a);
      const std::string q = squeeze(r.seed.substr(a + 3, b - a - 3));
      INFO("COVERAGE.md:" << r.line << " quotes 「" << q << "」, which the seeds do not hold");
      CHECK(all.find(q) != std::string::npos);
      quotes.push_back(q);
    }
  for (const std::string& item : items) {
    bool quoted = false;
    for (const std::string& q : quotes) quoted = quoted || (!q.empty() && item.find(q) != std::string::npos);
    INFO("a seed item no row of COVERAGE.md quotes: " << item);
    CHECK(quoted);
  }
}
