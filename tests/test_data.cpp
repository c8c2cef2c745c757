// Data parsers on small files the test writes (plain, gzip, truncated, corrupt), samplers and the loader.
#include <zlib.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/data/formats.h"
#include "core/data/loader.h"
#include "core/data/registry.h"
#include "core/util/error.h"

using namespace distlab;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("distlab-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  static int& counter() { static int c = 0; return c; }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

void be32(std::vector<uint8_t>& v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(uint8_t(x >> s));
}

std::vector<uint8_t> idx_images(uint32_t n, uint32_t rows, uint32_t cols) {
  std::vector<uint8_t> v;
  be32(v, 2051);
  be32(v, n);
  be32(v, rows);
  be32(v, cols);
  for (uint32_t i = 0; i < n * rows * cols; i++) v.push_back(uint8_t(i * 7));
  return v;
}

std::vector<uint8_t> idx_labels(uint32_t n) {
  std::vector<uint8_t> v;
  be32(v, 2049);
  be32(v, n);
  for (uint32_t i = 0; i < n; i++) v.push_back(uint8_t(i % 10));
  return v;
}

void write_plain(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), unsigned(bytes.size()));
  gzclose(f);
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("IDX images and labels read from plain and gzip files", "[data]") {
  TempDir d;
  write_plain(d.file("img"), idx_images(3, 2, 5));
  write_gz(d.file("img.gz"), idx_images(3, 2, 5));
  write_gz(d.file("lab.gz"), idx_labels(3));
  for (auto name : {"img", "img.gz"}) {
    IdxImages im = read_idx_images(d.file(name));
    CHECK(im.count == 3);
    CHECK(im.rows == 2);
    CHECK(im.cols == 5);
    REQUIRE(im.pixels.size() == 30);
    CHECK(im.pixels[29] == uint8_t(29 * 7));
  }
  CHECK(read_idx_labels(d.file("lab.gz"), 10) == std::vector<int32_t>{0, 1, 2});
}

TEST_CASE("truncated and corrupt IDX files are errors naming the file", "[data]") {
  TempDir d;
  auto img = idx_images(4, 3, 3);
  write_plain(d.file("short"), std::vector<uint8_t>(img.begin(), img.end() - 5));
  CHECK_THROWS_WITH(read_idx_images(d.file("short")), Catch::Contains(d.file("short")) && Catch::Contains("header says 4 images"));
  write_plain(d.file("tiny"), {0, 0, 8});
  CHECK_THROWS_WITH(read_idx_images(d.file("tiny")), Catch::Contains("too short"));
  write_plain(d.file("labels-as-images"), idx_labels(5));
  CHECK_THROWS_WITH(read_idx_images(d.file("labels-as-images")), Catch::Contains("magic number 2049 is not 2051"));
  auto lab = idx_labels(5);
  lab.back() = 42;
  write_plain(d.file("badlabel"), lab);
  CHECK_THROWS_WITH(read_idx_labels(d.file("badlabel"), 10), Catch::Contains("label 42"));
  // a gzip stream cut in half
  write_gz(d.file("full.gz"), idx_images(50, 28, 28));
  auto gz = read_all(d.file("full.gz"));
  write_plain(d.file("cut.gz"), std::vector<uint8_t>(gz.begin(), gz.begin() + long(gz.size() / 2)));
  CHECK_THROWS_AS(read_idx_images(d.file("cut.gz")), DataError);
  CHECK_THROWS_WITH(read_idx_images(d.file("missing.gz")), Catch::Contains("no such file"));
}

TEST_CASE("CIFAR-10 binary batches: records, truncation and bad labels", "[data]") {
  TempDir d;
  std::vector<uint8_t> rec;
  for (int r = 0; r < 3; r++) {
    rec.push_back(uint8_t(r + 4));
    for (int i = 0; i < 3072; i++) rec.push_back(uint8_t(r + i));
  }
  write_plain(d.file("b.bin"), rec);
  std::vector<uint8_t> px;
  std::vector<int32_t> labels;
  read_cifar10_batch(d.file("b.bin"), px, labels);
  CHECK(labels == std::vector<int32_t>{4, 5, 6});
  REQUIRE(px.size() == 3 * 3072);
  CHECK(px[3072 + 10] == uint8_t(1 + 10));
  write_plain(d.file("cut.bin"), std::vector<uint8_t>(rec.begin(), rec.end() - 1));
  CHECK_THROWS_WITH(read_cifar10_batch(d.file("cut.bin"), px, labels), Catch::Contains("3073-byte"));
  rec[0] = 11;
  write_plain(d.file("bad.bin"), rec);
  CHECK_THROWS_WITH(read_cifar10_batch(d.file("bad.bin"), px, labels), Catch::Contains("label 11"));
}

TEST_CASE("CIFAR-10 from a folder: a missing one is an error unless the file asks for the synthetic stand-in, which says so, and data.synthetic on purpose", "[data]") {
  TempDir d;
  std::vector<uint8_t> rec;
  for (int r = 0; r < 4; r++) {
    rec.push_back(uint8_t(r));
    for (int i = 0; i < 3072; i++) rec.push_back(uint8_t(i));
  }
  for (int i = 1; i <= 5; i++) write_plain(d.file("data_batch_" + std::to_string(i) + ".bin"), rec);
  write_plain(d.file("test_batch.bin"), rec);
  DataSpec s;
  s.name = "cifar10";
  s.path = d.path.string();
  DataSets real = open_datasets(s);
  CHECK(real.train->size() == 20);
  CHECK(real.test->size() == 4);
  CHECK_FALSE(real.synthetic);
  // a data.path that does not exist is an error, never a silent fall back
  s.path = d.file("nothing-here");
  CHECK_THROWS_WITH(open_datasets(s), Catch::Contains("data.path") && Catch::Contains("nothing-here"));
  // searched folders without CIFAR-10: an error naming them and the two ways on (by default, as a config
  // that names no fallback gets it); the synthetic stand-in, which says so, when the file asks for it
  fs::create_directories(d.file("empty"));
  s.path = d.file("empty");
  try {
    (void)open_datasets(s);
    FAIL("no error");
  } catch (const distlab::Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("empty") && Catch::Contains("CIFAR-10 not found"));
    CHECK_THAT(e.hint(), Catch::Contains("fetch-cifar10.sh") && Catch::Contains("--set data.synthetic=true"));
  }
  s.fallback = "synthetic";
  DataSets fake = open_datasets(s);
  CHECK(fake.synthetic);
  CHECK_THAT(fake.note, Catch::Contains("SYNTHETIC"));
  // data.synthetic = true: the stand-in on purpose, even with the real set at hand, in the named set's shape
  s.fallback = "error";
  s.path = d.path.string();
  s.synthetic = true;
  DataSets asked = open_datasets(s);
  CHECK(asked.synthetic);
  CHECK(asked.channels == 3);
  CHECK(asked.train->size() == s.synthetic_train);
  CHECK_THAT(asked.note, Catch::Contains("data.synthetic = true") && Catch::Contains("CIFAR-shaped"));
  s.name = "fashion-mnist";
  s.path = d.file("nothing-here");  // never looked at
  DataSets fm = open_datasets(s);
  CHECK(fm.synthetic);
  CHECK(fm.channels == 1);
  CHECK(fm.height == 28);
  CHECK_THAT(fm.note, Catch::Contains("Fashion-MNIST-shaped"));
  s.name = "tokens";
  s.text_file = d.file("data_batch_1.bin");
  CHECK_THROWS_WITH(open_datasets(s), Catch::Contains("data.synthetic = true and data.text_file"));
}

TEST_CASE("a missing Fashion-MNIST says where it looked and how to get it", "[data]") {
  DataSpec s;
  s.name = "fashion-mnist";
  s.path = "/nonexistent/fmnist";
  CHECK_THROWS_WITH(open_datasets(s), Catch::Contains("data.path '/nonexistent/fmnist'") && Catch::Contains("does not exist"));
  s.path = "";
  setenv("DISTLAB_DATA", "/nonexistent/data", 1);
  bool system_has_it = fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
  if (system_has_it) {
    CHECK(open_datasets(s).train->size() == 60000);  // $DISTLAB_DATA is searched, then the Debian package's folder
  } else {
    CHECK_THROWS_WITH(open_datasets(s), Catch::Contains("/nonexistent/data") && Catch::Contains("apt-get install dataset-fashion-mnist"));
  }
  {  // CIFAR-10 with $DISTLAB_DATA naming no folder: an error naming it, not a silent run on synthetic images
    DataSpec c;
    c.name = "cifar10";
    c.fallback = "synthetic";
    try {
      (void)open_datasets(c);
      FAIL("no error");
    } catch (const distlab::Error& e) {
      CHECK_THAT(e.what(), Catch::Contains("$DISTLAB_DATA is '/nonexistent/data', which does not exist"));
      CHECK_THAT(e.hint(), Catch::Contains("--set data.synthetic=true"));
    }
  }
  unsetenv("DISTLAB_DATA");
}

TEST_CASE("synthetic sets are deterministic in the seed and learnable in shape", "[data]") {
  auto a = synthetic_images(50, 3, 8, 8, 10, 7, "a");
  auto b = synthetic_images(50, 3, 8, 8, 10, 7, "b");
  auto c = synthetic_images(50, 3, 8, 8, 10, 8, "c");
  auto bytes = [](const ImageDataset& d) {
    std::vector<uint8_t> all;
    for (int64_t i = 0; i < d.size(); i++) {
      auto im = d.image(i);
      all.insert(all.end(), im.begin(), im.end());
    }
    return all;
  };
  CHECK(bytes(*a) == bytes(*b));
  CHECK(a->labels() == b->labels());
  CHECK(bytes(*a) != bytes(*c));
  // drawn on demand, an image is the same bytes whenever, and from whichever copy, it is asked for
  CHECK(a->image(30) == a->image(30));
  CHECK(a->image(3) == b->image(3));
  std::set<int32_t> classes(a->labels().begin(), a->labels().end());
  CHECK(classes.size() > 5);
  auto t1 = synthetic_tokens(1000, 17, 3), t2 = synthetic_tokens(1000, 17, 3);
  CHECK(t1 == t2);
  for (auto t : t1) CHECK((t >= 0 && t < 17));
}

TEST_CASE("token windows: targets are the inputs shifted by one", "[data]") {
  std::vector<int32_t> toks;
  for (int i = 0; i < 23; i++) toks.push_back(i);
  TokenDataset ds("t", toks, 5, 100, false);
  CHECK(ds.size() == 4);  // (23 - 1) / 5
  Runtime rt;
  Batch b = ds.make_batch(rt, {1, 3});
  CHECK(b.B == 2);
  CHECK(b.T == 5);
  CHECK(b.tokens == std::vector<int32_t>{5, 6, 7, 8, 9, 15, 16, 17, 18, 19});
  CHECK(b.targets == std::vector<int32_t>{6, 7, 8, 9, 10, 16, 17, 18, 19, 20});
}

TEST_CASE("samplers: sequential, seeded permutations per epoch", "[data]") {
  SequentialSampler seq(5);
  CHECK(seq.indices(3) == std::vector<int64_t>{0, 1, 2, 3, 4});
  RandomSampler r(100, 42);
  auto e0 = r.indices(0), e0b = r.indices(0), e1 = r.indices(1);
  CHECK(e0 == e0b);
  CHECK(e0 != e1);
  std::set<int64_t> all(e0.begin(), e0.end());
  CHECK(all.size() == 100);
  CHECK(*all.begin() == 0);
  CHECK(*all.rbegin() == 99);
  CHECK(RandomSampler(0, 1).indices(0).empty());
  CHECK(RandomSampler(1, 1).indices(0) == std::vector<int64_t>{0});
}

TEST_CASE("the loader batches, keeps or drops the last short batch", "[data]") {
  auto ds = synthetic_images(10, 1, 2, 2, 3, 1, "s");
  Runtime rt;
  for (bool drop : {false, true}) {
    DataLoader dl(*ds, std::make_shared<SequentialSampler>(10), 4, drop);
    CHECK(dl.batches_per_epoch() == (drop ? 2 : 3));
    dl.start_epoch(0);
    Batch b;
    std::vector<int64_t> sizes;
    while (dl.next(rt, b)) sizes.push_back(b.B);
    CHECK(sizes == (drop ? std::vector<int64_t>{4, 4} : std::vector<int64_t>{4, 4, 2}));
  }
  CHECK_THROWS_AS(DataLoader(*ds, std::make_shared<SequentialSampler>(10), 0, false), ConfigError);
}

TEST_CASE("image batches are normalized per channel", "[data]") {
  std::vector<uint8_t> px = {0, 255, 51, 102};  // 1 image, 1 channel, 2x2
  ImageDataset ds("n", 1, 2, 2, px, {1}, {0.5f}, {0.25f});
  Runtime rt;
  Batch b = ds.make_batch(rt, {0});
  const float* x = b.x.f32();
  CHECK(x[0] == Approx(-2.0f));
  CHECK(x[1] == Approx(2.0f));
  CHECK(x[2] == Approx((0.2f - 0.5f) / 0.25f));
  CHECK(b.targets == std::vector<int32_t>{1});
}

TEST_CASE("an IDX header whose count x rows x cols wraps around is refused", "[data]") {
  TempDir d;
  // 2^32-1 images of 2^32-1 x 2^32-1: the 64-bit product wraps; the header must be refused on its own terms
  std::vector<uint8_t> v;
  be32(v, 2051);
  be32(v, 0xFFFFFFFFu);
  be32(v, 0xFFFFFFFFu);
  be32(v, 0xFFFFFFFFu);
  for (int i = 0; i < 15; i++) v.push_back(0);
  write_plain(d.file("wrap"), v);
  CHECK_THROWS_WITH(read_idx_images(d.file("wrap")), Catch::Contains("not a plausible image file"));
  std::vector<uint8_t> zero;
  be32(zero, 2051);
  be32(zero, 4);
  be32(zero, 0);
  be32(zero, 28);
  write_plain(d.file("zero-rows"), zero);
  CHECK_THROWS_AS(read_idx_images(d.file("zero-rows")), DataError);
}

TEST_CASE("data.path that is not a folder, and a text file that is a folder or a device, are errors", "[data]") {
  TempDir d;
  DataSpec s;
  s.name = "fashion-mnist";
  s.path = d.file("no-such-folder");
  CHECK_THROWS_WITH(open_datasets(s), Catch::Contains("data.path") && Catch::Contains("does not exist"));
  s.name = "cifar10";
  CHECK_THROWS_WITH(open_datasets(s), Catch::Contains("data.path"));  // not a silent synthetic fallback
  s = DataSpec{};
  s.name = "tokens";
  s.text_file = d.path.string();
  CHECK_THROWS_WITH(open_datasets(s), Catch::Contains("data.text_file") && Catch::Contains("not a regular file"));
  s.text_file = "/dev/zero";  // would read forever
  CHECK_THROWS_WITH(open_datasets(s), Catch::Contains("not a regular file"));
}

TEST_CASE("data.corrupt makes records NaN, data.check_finite names them, data.exclude leaves them out", "[data]") {
  Runtime rt;
  auto corrupt = std::make_unique<CorruptRecords>(synthetic_images(12, 1, 2, 2, 3, 1, "s"), std::vector<int64_t>{5});
  Batch b = corrupt->make_batch(rt, {4, 5, 6});
  const float* x = b.x.f32();
  for (int k = 0; k < 4; k++) {
    CHECK(std::isfinite(x[k]));
    CHECK(std::isnan(x[4 + k]));  // record 5, every value
    CHECK(std::isfinite(x[8 + k]));
  }
  // unchecked, the NaN batch goes through (the loss will say "nan" later); checked, the record is named
  DataLoader quiet(*corrupt, std::make_shared<SequentialSampler>(12), 4, false);
  Batch q;
  CHECK(quiet.next(rt, q));
  CHECK(quiet.next(rt, q));
  DataLoader checked(*corrupt, std::make_shared<SequentialSampler>(12), 4, false, true);
  Batch c;
  CHECK(checked.next(rt, c));  // records 0-3
  CHECK_THROWS_WITH(checked.next(rt, c), Catch::Contains("train record 5 (4 of its 4 values) in batch 2 of epoch 0"));

  // left out: 11 records, every index past 5 shifted by one, and the source index still the file's
  auto kept = std::make_unique<ExcludeRecords>(std::move(corrupt), std::vector<int64_t>{5});
  CHECK(kept->size() == 11);
  CHECK(kept->source_index(5) == 6);
  CHECK_THAT(kept->describe(), Catch::Contains("1 record left out"));
  DataLoader clean(*kept, std::make_shared<SequentialSampler>(11), 4, false, true);
  Batch e;
  int batches = 0;
  while (clean.next(rt, e)) batches++;
  CHECK(batches == 3);
  auto plain = synthetic_images(12, 1, 2, 2, 3, 1, "s");
  Batch want = plain->make_batch(rt, {6});
  Batch got = kept->make_batch(rt, {5});
  CHECK(std::equal(want.x.f32(), want.x.f32() + 4, got.x.f32()));
  CHECK(want.targets == got.targets);

  // out of range, not images, nothing left
  CHECK_THROWS_WITH(CorruptRecords(synthetic_images(12, 1, 2, 2, 3, 1, "s"), {12}), Catch::Contains("data.corrupt: index 12"));
  CHECK_THROWS_WITH(ExcludeRecords(synthetic_images(3, 1, 2, 2, 3, 1, "s"), {-1}), Catch::Contains("data.exclude: index -1"));
  CHECK_THROWS_WITH(ExcludeRecords(synthetic_images(2, 1, 2, 2, 3, 1, "s"), {0, 1}), Catch::Contains("leaves no record"));
  CHECK_THROWS_AS(CorruptRecords(std::make_unique<TokenDataset>("t", synthetic_tokens(100, 7, 1), 4, 7, true), {0}), DataError);
}
