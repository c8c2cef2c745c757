#include "core/data/registry.h"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/data/formats.h"
#include "core/data/sampler.h"
#include "core/util/error.h"
#include "core/util/rng.h"

namespace fs = std::filesystem;

namespace distlab {

// Tuned so the reference CNN reaches ~85 % test accuracy after one epoch of 10,000 images: a curve worth
// watching, neither trivial nor hopeless.
constexpr float kSyntheticContrastLo = 0.0f, kSyntheticContrastHi = 25.0f, kSyntheticNoise = 100.0f;

// Candidate folders, in order: data.path, $DISTLAB_DATA/<sub>, $DISTLAB_DATA, then `system`.
static std::vector<std::string> candidates(const DataSpec& s, const std::string& sub, const std::string& system) {
  std::vector<std::string> c;
  if (!s.path.empty()) {  // a folder the user named is the only place looked: no silent fall back to another one
    std::error_code ec;
    if (!fs::is_directory(s.path, ec))
      throw DataError(fmt::format("data.path '{}' is not a folder{}", s.path, fs::exists(s.path, ec) ? "" : " (it does not exist)"),
                      "set data.path to the folder that holds the data files, or leave it unset to search $DISTLAB_DATA "
                      "and the system folders");
    return {s.path};
  }
  if (const char* env = std::getenv("DISTLAB_DATA"); env && *env) {
    c.push_back((fs::path(env) / sub).string());
    c.push_back(env);
  }
  if (!system.empty()) c.push_back(system);
  return c;
}

static std::string first_with(const std::vector<std::string>& dirs, const std::vector<std::string>& names) {
  for (const auto& d : dirs)
    for (const auto& n : names)
      if (fs::exists(fs::path(d) / n)) return d;
  return "";
}

static std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

static DataSets open_fashion_mnist(const DataSpec& s) {
  auto dirs = candidates(s, "fashion-mnist", "/usr/share/datasets/fashion-mnist");
  std::string dir = first_with(dirs, {"train-images-idx3-ubyte.gz", "train-images-idx3-ubyte"});
  if (dir.empty())
    throw DataError("Fashion-MNIST not found: looked for train-images-idx3-ubyte[.gz] in " + join(dirs),
                    "install it with `sudo apt-get install dataset-fashion-mnist` (files land in "
                    "/usr/share/datasets/fashion-mnist), or set data.path to a folder with the four IDX files");
  auto file = [&](const std::string& stem) {
    fs::path gz = fs::path(dir) / (stem + ".gz");
    return fs::exists(gz) ? gz.string() : (fs::path(dir) / stem).string();
  };
  DataSets d;
  const std::vector<float> mean = {0.2860f}, stdv = {0.3530f};
  for (int split = 0; split < 2; split++) {
    const std::string pre = split == 0 ? "train" : "t10k";
    IdxImages im = read_idx_images(file(pre + "-images-idx3-ubyte"));
    std::vector<int32_t> labels = read_idx_labels(file(pre + "-labels-idx1-ubyte"), 10);
    if (int64_t(labels.size()) != im.count)
      throw DataError(fmt::format("Fashion-MNIST {}: {} images but {} labels in {}", pre, im.count, labels.size(), dir));
    auto ds = std::make_unique<ImageDataset>(
        fmt::format("Fashion-MNIST {}: {} images 1x{}x{} ({})", split == 0 ? "train" : "test", im.count, im.rows, im.cols, dir),
        1, im.rows, im.cols, std::move(im.pixels), std::move(labels), mean, stdv);
    (split == 0 ? d.train : d.test) = std::move(ds);
  }
  d.channels = 1;
  d.height = d.width = 28;
  d.classes = 10;
  d.note = d.train->describe() + "\n" + d.test->describe();
  return d;
}

std::unique_ptr<ImageDataset> synthetic_images(int64_t n, int64_t C, int64_t H, int64_t W, int64_t classes,
                                               uint64_t seed, const std::string& label, uint64_t class_seed) {
  // Each class has a smooth prototype: a 4x4 grid of random levels per channel, stretched to H x W.
  // A sample is its class's prototype, dimmed or brightened, plus uniform noise, so classes overlap but
  // are learnable. The prototypes come from class_seed: a train and a test split share them.
  // One generator draws, image after image, a label, a contrast and C*H*W noise values. The bytes are not
  // kept: this pass keeps each image's label, contrast and the generator's state before its noise, and
  // steps over the noise; a batch draws its images again from those states, the same bytes as drawing the
  // whole set in order. Holding them cost more than drawing them: the first touch of lab 02's 31 MB of
  // images took 86 ms per rank, drawing all of them 50 ms, drawing a batch's 64 under 1 ms.
  struct Drawn {
    std::vector<float> protos;
    std::vector<int64_t> col;  // the prototype's column under pixel column w
    std::vector<int32_t> labels;
    std::vector<float> contrast;
    std::vector<Rng> noise;  // the generator at the start of image i's noise
    int64_t C, H, W;
  };
  auto d = std::make_shared<Drawn>();
  d->C = C, d->H = H, d->W = W;
  Rng proto_rng(class_seed * 7919 + 17);
  d->protos.resize(size_t(classes * C * 16));
  for (auto& p : d->protos) p = proto_rng.uniform(-1.0f, 1.0f);
  d->col.resize(size_t(W));
  for (int64_t w = 0; w < W; w++) d->col[size_t(w)] = w * 4 / W;
  d->labels.resize(size_t(n));
  d->contrast.resize(size_t(n));
  d->noise.reserve(size_t(n));
  Rng rng(seed);
  for (int64_t i = 0; i < n; i++) {
    d->labels[size_t(i)] = int32_t(rng.below(uint64_t(classes)));
    d->contrast[size_t(i)] = rng.uniform(kSyntheticContrastLo, kSyntheticContrastHi);
    d->noise.push_back(rng);
    for (int64_t k = 0; k < C * H * W; k++) rng.next_u64();  // each noise value is one draw
  }
  ImageDataset::Draw draw = [d](int64_t i, uint8_t* out) {  // written in order: channel, row, column
    Rng r = d->noise[size_t(i)];
    const int32_t y = d->labels[size_t(i)];
    const float contrast = d->contrast[size_t(i)];
    for (int64_t c = 0; c < d->C; c++)
      for (int64_t h = 0; h < d->H; h++) {
        const float* row = &d->protos[size_t(((y * d->C + c) * 4 + h * 4 / d->H) * 4)];
        for (int64_t w = 0; w < d->W; w++) {
          float v = 128.0f + contrast * row[d->col[size_t(w)]] + r.uniform(-kSyntheticNoise, kSyntheticNoise);
          *out++ = uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
        }
      }
  };
  std::vector<float> mean(size_t(C), 0.5f), stdv(size_t(C), 0.25f);
  return std::make_unique<ImageDataset>(label, C, H, W, std::move(draw), d->labels, mean, stdv);
}

// A synthetic stand-in: CIFAR-shaped (3x32x32), or Fashion-MNIST-shaped (1x28x28) for data.synthetic on it
static DataSets synthetic_image_sets(const DataSpec& s, const std::string& why, int64_t C = 3, int64_t H = 32, const char* like = "CIFAR") {
  DataSets d;
  d.channels = C;
  d.height = d.width = H;
  d.classes = 10;
  d.synthetic = true;
  d.train = synthetic_images(s.synthetic_train, C, H, H, 10, s.seed * 2 + 1,
                             fmt::format("SYNTHETIC {}-shaped train: {} images {}x{}x{}, 10 classes", like, s.synthetic_train, C, H, H), s.seed);
  d.test = synthetic_images(s.synthetic_test, C, H, H, 10, s.seed * 2 + 2,
                            fmt::format("SYNTHETIC {}-shaped test: {} images", like, s.synthetic_test), s.seed);
  d.note = why + d.train->describe() + "\n" + d.test->describe();
  return d;
}

static DataSets open_cifar10(const DataSpec& s) {
  auto dirs = candidates(s, "cifar-10-batches-bin", "");
  std::string dir = first_with(dirs, {"data_batch_1.bin"});
  if (dir.empty()) {
    // $DISTLAB_DATA naming no folder at all is a mistake to say, not a reason to train on made-up images (it
    // did, exit 0, the second line of the log saying so). One that exists without CIFAR-10 in it (it holds the
    // other data sets) leaves the choice to data.fallback
    if (const char* env = std::getenv("DISTLAB_DATA"); env && *env && !fs::is_directory(env))
      throw DataError(fmt::format("CIFAR-10 not found: $DISTLAB_DATA is '{}', which {}", env, fs::exists(env) ? "is not a folder" : "does not exist"),
                      "point $DISTLAB_DATA at the folder that holds cifar-10-batches-bin/ (datasets/README.md: datasets/fetch-cifar10.sh on an "
                      "online machine), unset it, or train on synthetic images on purpose: --set data.synthetic=true");
    if (s.fallback == "synthetic")
      return synthetic_image_sets(s, "CIFAR-10 not found (looked in " + (dirs.empty() ? std::string("no folder: data.path and $DISTLAB_DATA unset") : join(dirs)) +
                                         "): training on a SYNTHETIC CIFAR-shaped data set instead; see datasets/README.md to get the real one\n");
    throw DataError("CIFAR-10 not found: looked for data_batch_1.bin in " + (dirs.empty() ? std::string("(no folder given)") : join(dirs)),
                    "fetch it on an online machine with datasets/fetch-cifar10.sh and set data.path or $DISTLAB_DATA, or train on "
                    "synthetic CIFAR-shaped images on purpose: --set data.synthetic=true");
  }
  DataSets d;
  std::vector<uint8_t> px;
  std::vector<int32_t> labels;
  for (int i = 1; i <= 5; i++) read_cifar10_batch((fs::path(dir) / fmt::format("data_batch_{}.bin", i)).string(), px, labels);
  const std::vector<float> mean = {0.4914f, 0.4822f, 0.4465f}, stdv = {0.2470f, 0.2435f, 0.2616f};
  int64_t n = int64_t(labels.size());
  d.train = std::make_unique<ImageDataset>(fmt::format("CIFAR-10 train: {} images 3x32x32 ({})", n, dir), 3, 32, 32,
                                           std::move(px), std::move(labels), mean, stdv);
  std::vector<uint8_t> tpx;
  std::vector<int32_t> tl;
  read_cifar10_batch((fs::path(dir) / "test_batch.bin").string(), tpx, tl);
  n = int64_t(tl.size());
  d.test = std::make_unique<ImageDataset>(fmt::format("CIFAR-10 test: {} images", n), 3, 32, 32, std::move(tpx),
                                          std::move(tl), mean, stdv);
  d.channels = 3;
  d.height = d.width = 32;
  d.classes = 10;
  d.note = d.train->describe() + "\n" + d.test->describe();
  return d;
}

std::vector<int32_t> synthetic_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> next = seeded_permutation(vocab, seed * 31 + 5);
  Rng rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  int64_t cur = int64_t(rng.below(uint64_t(vocab)));
  for (int64_t i = 0; i < n; i++) {
    t[size_t(i)] = int32_t(cur);
    cur = rng.uniform() < 0.8f ? next[size_t(cur)] : int64_t(rng.below(uint64_t(vocab)));
  }
  return t;
}

static DataSets open_tokens(const DataSpec& s) {
  DataSets d;
  std::vector<int32_t> all;
  std::string what;
  if (!s.text_file.empty()) {
    constexpr uintmax_t kMaxText = uintmax_t(1) << 30;  // bytes become 4-byte tokens: 4 GiB in memory
    std::error_code ec;
    if (!fs::is_regular_file(s.text_file, ec))
      throw DataError(fmt::format("data.text_file '{}' is not a regular file{}", s.text_file,
                                  fs::exists(s.text_file, ec) ? " (a folder or a device?)" : " (it does not exist)"),
                      "give the path of a text file");
    if (fs::file_size(s.text_file, ec) > kMaxText)
      throw DataError(fmt::format("data.text_file '{}' is larger than 1 GiB", s.text_file), "use a smaller text, or a slice of it");
    std::ifstream f(s.text_file, std::ios::binary);
    if (!f) throw DataError(fmt::format("data.text_file: cannot read '{}'", s.text_file), "give the path of a text file");
    std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    for (unsigned char c : bytes) all.push_back(int32_t(c));
    d.vocab = 256;
    what = fmt::format("bytes of {}", s.text_file);
  } else {
    all = synthetic_tokens(s.synthetic_tokens, s.vocab, s.seed);
    d.vocab = s.vocab;
    d.synthetic = true;
    what = fmt::format("SYNTHETIC token stream, vocab {}", s.vocab);
  }
  // the last tenth (at least two windows) is the test split
  int64_t n_test = std::max<int64_t>(int64_t(all.size()) / 10, 2 * s.seq_len + 1);
  if (n_test >= int64_t(all.size()))
    throw DataError(fmt::format("{}: {} tokens are too few for seq_len {}", what, all.size(), s.seq_len),
                    "use a longer text or a smaller data.seq_len");
  std::vector<int32_t> train(all.begin(), all.end() - n_test), test(all.end() - n_test, all.end());
  d.train = std::make_unique<TokenDataset>(fmt::format("tokens train: {} tokens ({})", train.size(), what), std::move(train),
                                           s.seq_len, d.vocab, d.synthetic);
  d.test = std::make_unique<TokenDataset>(fmt::format("tokens test: {} tokens", test.size()), std::move(test), s.seq_len,
                                          d.vocab, d.synthetic);
  d.note = d.train->describe() + "\n" + d.test->describe();
  return d;
}

static DataSets open_named(const DataSpec& s) {
  if (s.synthetic) {  // asked for: the named set's shape, made up, whatever is on disk
    const std::string why = "data.synthetic = true: ";
    if (s.name == "cifar10" || s.name == "synthetic-images") return synthetic_image_sets(s, why);
    if (s.name == "fashion-mnist") return synthetic_image_sets(s, why, 1, 28, "Fashion-MNIST");
    if (s.name == "tokens" && s.text_file.empty()) return open_tokens(s);  // the synthetic stream already
    if (s.name == "tokens")
      throw ConfigError("data.synthetic = true and data.text_file = '" + s.text_file + "' contradict each other",
                        "leave data.text_file out for the synthetic token stream, or set data.synthetic = false to read the file");
  }
  if (s.name == "fashion-mnist") return open_fashion_mnist(s);
  if (s.name == "cifar10") return open_cifar10(s);
  if (s.name == "synthetic-images") return synthetic_image_sets(s, "");
  if (s.name == "tokens") return open_tokens(s);
  throw ConfigError("unknown data.name '" + s.name + "'", "use fashion-mnist, cifar10, synthetic-images or tokens");
}

DataSets open_datasets(const DataSpec& s) {
  DataSets d = open_named(s);
  // the train split's records: some corrupt (their indices as the files number them), some left out
  if (!s.corrupt.empty()) d.train = std::make_unique<CorruptRecords>(std::move(d.train), s.corrupt);
  if (!s.exclude.empty()) {
    d.train = std::make_unique<ExcludeRecords>(std::move(d.train), s.exclude);
    d.note += fmt::format("\ntrain split with data.exclude: {} records remain", d.train->size());
  }
  return d;
}

}  // namespace distlab
