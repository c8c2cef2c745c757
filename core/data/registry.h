// Opens the train and test sets a config names, looking in data.path, then $DISTLAB_DATA, then the
// Debian package's folder. A missing data set is an error that says where it looked and how to get it —
// except CIFAR-10 with data.fallback = "synthetic" (lab and example configs that must run anywhere), which
// trains on a learnable synthetic stand-in and says so. data.synthetic = true asks for the stand-in of the
// named set (its shape and classes) on purpose, whether the real one is there or not.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/data/dataset.h"

namespace distlab {

struct DataSpec {
  std::string name = "fashion-mnist";  // fashion-mnist | cifar10 | synthetic-images | tokens
  std::string path;                    // folder with the files; "" = the default places
  std::string fallback = "error";      // cifar10 when missing: error | synthetic (the file's explicit choice)
  bool synthetic = false;              // the named image set's synthetic stand-in, on purpose
  int64_t synthetic_train = 10000, synthetic_test = 2000;  // synthetic image counts
  int64_t seq_len = 64;                // tokens: window length T
  std::string text_file;               // tokens: a text file read as bytes; "" = a synthetic stream
  int64_t synthetic_tokens = 200000;   // tokens: length of the synthetic stream
  int64_t vocab = 256;                 // tokens: vocabulary of the synthetic stream
  std::vector<int64_t> corrupt;        // train records whose inputs come out NaN (lab 08's NaN case)
  std::vector<int64_t> exclude;        // train records left out
  bool check_finite = false;           // every batch's inputs checked for NaN/Inf, the sample named
  uint64_t seed = 0;
};

struct DataSets {
  std::unique_ptr<Dataset> train, test;
  int64_t channels = 0, height = 0, width = 0, classes = 0;  // image data
  int64_t vocab = 0;                                         // token data
  bool synthetic = false;
  std::string note;  // what was loaded from where, printed at the start of a run
};

DataSets open_datasets(const DataSpec& spec);

// Learnable synthetic sets (deterministic in the seed).
std::unique_ptr<ImageDataset> synthetic_images(int64_t n, int64_t C, int64_t H, int64_t W, int64_t classes,
                                               uint64_t seed, const std::string& label, uint64_t class_seed = 0);
// A stream where each token follows its predecessor through a fixed random map with probability 0.8 and
// is uniform otherwise: a model can learn it down to about 0.8·0 + 0.2·ln(V) nats plus the mixing.
std::vector<int32_t> synthetic_tokens(int64_t n, int64_t vocab, uint64_t seed);

}  // namespace distlab
