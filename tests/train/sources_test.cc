// Datasets that NumPy and Pillow wrote (Debian's python3-numpy and
// python3-pil), read by train/sources.h, and trained on by `shoal train`.
#include "shoal/train/sources.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cli/run_shoal.h"
#include "temp_dir.h"

namespace shoal::train {
namespace {

namespace fs = std::filesystem;
using testing::run_sh;

constexpr const char* kPython = "/usr/bin/python3";

// Runs a Python snippet in `dir`; false (with the reason) when NumPy or
// Pillow is missing, so the test can skip instead of passing.
bool python(const std::string& dir, const std::string& code, std::string* why) {
  if (!fs::exists(kPython)) {
    *why = "no /usr/bin/python3 (apt-get install python3-numpy python3-pil)";
    return false;
  }
  auto probe = run_sh(fmt::format("{} -c 'import numpy, PIL'", kPython));
  if (probe.code != 0) {
    *why = "python3-numpy or python3-pil missing: " + probe.out;
    return false;
  }
  std::string script = dir + "/make.py";
  std::ofstream(script) << "import numpy as np\nimport os\n" << code;
  auto r = run_sh(fmt::format("cd {} && {} make.py", dir, kPython));
  EXPECT_EQ(r.code, 0) << r.out;
  return r.code == 0;
}

#define NEED_PYTHON(dir, code)                 \
  do {                                         \
    std::string why_;                          \
    if (!python(dir, code, &why_)) {           \
      if (!why_.empty()) GTEST_SKIP() << why_; \
      return;                                  \
    }                                          \
  } while (0)

TEST(Npy, ReadsWhatNumPyWrites) {
  testing::TempDir t("npy");
  NEED_PYTHON(t.path(), R"(
a = np.arange(24).reshape(2, 3, 4)
for name, dt in [('u1', 'u1'), ('i1', 'i1'), ('i2', '<i2'), ('u2', '<u2'), ('i4', '<i4'),
                 ('i8', '<i8'), ('u4', '<u4'), ('f2', '<f2'), ('f4', '<f4'), ('f8', '<f8'),
                 ('b1', '?')]:
    np.save(name + '.npy', (a % 2 == 1) if dt == '?' else (a - 5 if dt[-2] == 'i' else a).astype(dt))
np.save('fortran.npy', np.asfortranarray(a.astype('f4')))
np.save('big.npy', a.astype('>f4'))
np.save('scalar.npy', np.float32(3))
open('trunc.npy', 'wb').write(open('f4.npy', 'rb').read()[:-3])
)");
  for (std::string n : {"u1", "i1", "i2", "u2", "i4", "i8", "u4", "f2", "f4", "f8", "b1"}) {
    auto r = read_npy(t.path() + "/" + n + ".npy");
    ASSERT_TRUE(r.ok()) << n << ": " << r.status().to_string();
    EXPECT_EQ(r->shape(), (Shape{2, 3, 4})) << n;
    bool is_signed = n[0] == 'i';
    for (std::int64_t i = 0; i < 24; ++i) {
      double want = n == "b1" ? i % 2 : (is_signed ? i - 5 : i);
      ASSERT_EQ(r->get(i), want) << n << " element " << i;
    }
  }
  auto fortran = read_npy(t.path() + "/fortran.npy");
  ASSERT_FALSE(fortran.ok());
  EXPECT_NE(fortran.status().message().find("Fortran order"), std::string::npos);
  auto big = read_npy(t.path() + "/big.npy");
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("'>f4' is not supported"), std::string::npos)
      << big.status().to_string();
  auto scalar = read_npy(t.path() + "/scalar.npy");
  ASSERT_TRUE(scalar.ok()) << scalar.status().to_string();
  EXPECT_EQ(scalar->numel(), 1);
  auto trunc = read_npy(t.path() + "/trunc.npy");
  ASSERT_FALSE(trunc.ok());
  EXPECT_NE(trunc.status().message().find("trunc.npy: .npy data: shape [2, 3, 4] of '<f4' needs "
                                          "96 bytes, the file has 93 (truncated)"),
            std::string::npos)
      << trunc.status().to_string();
  auto not_npy = parse_npy("hello world", "x.npy");
  ASSERT_FALSE(not_npy.ok());
  EXPECT_NE(not_npy.status().message().find("x.npy: not a .npy file"), std::string::npos);
}

TEST(Npz, StoredAndDeflatedArchivesGiveBothSplits) {
  testing::TempDir t("npz");
  NEED_PYTHON(t.path(), R"(
rng = np.random.default_rng(0)
xtr = rng.standard_normal((50, 6)).astype('f8'); ytr = np.arange(50) % 3
xte = rng.standard_normal((20, 6)).astype('f8'); yte = np.arange(20) % 4
np.savez('plain.npz', x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
np.savez_compressed('packed.npz', x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
np.savez('missing.npz', x_train=xtr, y_train=ytr)
np.savez('neg.npz', x_train=xtr, y_train=ytr - 1, x_test=xte, y_test=yte)
np.savez('mismatch.npz', x_train=xtr, y_train=ytr, x_test=xte[:, :5], y_test=yte)
np.save('first.npy', xtr[0].astype('f4'))
)");
  auto first = read_npy(t.path() + "/first.npy");
  ASSERT_TRUE(first.ok());
  for (const char* f : {"plain.npz", "packed.npz"}) {
    auto s = load_data(t.path() + "/" + f);
    ASSERT_TRUE(s.ok()) << f << ": " << s.status().to_string();
    EXPECT_EQ(s->train.images.shape(), (Shape{50, 6})) << f;
    EXPECT_EQ(s->train.images.dtype(), DType::kF32) << f;
    EXPECT_EQ(s->test.size(), 20) << f;
    EXPECT_EQ(s->train.num_classes, 4) << f;  // labels 0..3 over both splits
    EXPECT_EQ(s->test.labels.get(7), 3) << f;
    for (int i = 0; i < 6; ++i) EXPECT_EQ(s->train.images.get(i), first->get(i)) << f;
  }
  auto missing = load_data(t.path() + "/missing.npz");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no array 'x_test' (found [x_train, y_train]"),
            std::string::npos)
      << missing.status().to_string();
  auto neg = load_data(t.path() + "/neg.npz");
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("y_train: label -1 at index 0"), std::string::npos)
      << neg.status().to_string();
  auto mm = load_data(t.path() + "/mismatch.npz");
  ASSERT_FALSE(mm.ok());
  EXPECT_NE(mm.status().message().find("training samples are [6] but test samples are [5]"),
            std::string::npos)
      << mm.status().to_string();
  auto none = load_data(t.path());
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("NumPy arrays (x_train.npy"), std::string::npos)
      << none.status().to_string();
}

// Non-finite inputs are refused by name with their first place (before:
// one NaN made the normalization's mean NaN and a run ended rc 0 at chance),
// and so are samples with no values ([N, 0]: trained silently before).
TEST(Npz, NonFiniteOrEmptySamplesAreRefusedByName) {
  testing::TempDir t("npz_bad");
  NEED_PYTHON(t.path(), R"(
xtr = np.ones((10, 4), 'f4'); ytr = np.arange(10) % 2
nan = xtr.copy(); nan[3, 2] = np.nan
inf = xtr.copy(); inf[9, 0] = -np.inf
np.savez('nan.npz', x_train=nan, y_train=ytr, x_test=xtr, y_test=ytr)
np.savez('inf.npz', x_train=xtr, y_train=ytr, x_test=inf, y_test=ytr)
np.savez('allnan.npz', x_train=np.full((10, 4), np.nan, 'f8'), y_train=ytr, x_test=xtr, y_test=ytr)
np.savez('empty.npz', x_train=np.ones((10, 0), 'f4'), y_train=ytr, x_test=xtr, y_test=ytr)
big = ytr.copy(); big[4] = 100000
np.savez('big.npz', x_train=xtr, y_train=big, x_test=xtr, y_test=ytr)
objs = np.empty(10, dtype=object); objs[:] = [[1.0]] * 10
np.savez('objects.npz', x_train=objs, y_train=ytr, x_test=xtr, y_test=ytr)
)");
  struct Case {
    const char* file;
    const char* needle;
  } cases[] = {
      {"nan.npz", "nan:train: x_train holds nan at sample 3, element 2"},
      {"inf.npz", "inf:test: x_test holds -inf at sample 9, element 0"},
      {"allnan.npz", "x_train holds nan at sample 0, element 0"},
      {"empty.npz", "x_train: samples of shape [10, 0] hold no values"},
      // Before: a 100,001-class model, built silently.
      {"big.npz", "y_train: label 100000 at index 4 is not a class index in [0, 65536)"},
      {"objects.npz", "the array holds Python objects (dtype object"},
  };
  for (const auto& c : cases) {
    auto s = load_data(t.path() + "/" + c.file);
    ASSERT_FALSE(s.ok()) << c.file;
    EXPECT_NE(s.status().message().find(c.needle), std::string::npos)
        << c.file << ": " << s.status().to_string();
  }
}

// The number of classes can be stated: labels outside it are refused by
// name (split, label, index), and the model gets that many outputs. Left
// to the labels, a stray label of 5,000 among ten classes built a 5,001-way
// model silently; now a warning says so.
TEST(Npz, ClassesAreStatedOrASparseLabelRangeIsSaid) {
  testing::TempDir t("npz_classes");
  NEED_PYTHON(t.path(), R"(
rng = np.random.default_rng(0)
x = rng.random((64, 6), dtype=np.float32); y = np.arange(64) % 3
np.savez('three.npz', x_train=x, y_train=y, x_test=x[:16], y_test=y[:16])
far = y.copy(); far[7] = 5000
np.savez('far.npz', x_train=x, y_train=far, x_test=x[:16], y_test=y[:16])
)");
  const std::string train = std::string(SHOAL_BINARY) +
                            " train --model mlp --epochs 1 --batch 16 --no-plot --no-checkpoints "
                            "--threads 1 --out " +
                            t.path() + "/run --data " + t.path();
  auto five = run_sh(train + "/three.npz --classes 5");
  EXPECT_EQ(five.code, 0) << five.out;
  auto two = run_sh(train + "/three.npz --classes 2");
  EXPECT_NE(two.code, 0) << two.out;
  EXPECT_NE(two.out.find("three:train: label 2 at index 2 is outside --classes 2 ([0, 2))"),
            std::string::npos)
      << two.out;
  auto far = run_sh(train + "/far.npz --max-steps 1");
  EXPECT_NE(far.out.find("the labels go up to 5000 but only 4 distinct values occur: the model "
                         "gets 5001 outputs; pass --classes N"),
            std::string::npos)
      << far.out;
  auto refused = run_sh(train + "/far.npz --classes 3");
  EXPECT_NE(refused.out.find("far:train: label 5000 at index 7 is outside --classes 3"),
            std::string::npos)
      << refused.out;
}

// A directory with some of the IDX files names the one missing (before:
// "no dataset found: expected IDX files (...)" for 3 of 4 present).
TEST(Idx, AMissingFileOfFourIsNamed) {
  testing::TempDir t("idx_missing");
  const char* src = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(src))
    GTEST_SKIP() << src << " is missing (apt-get install dataset-fashion-mnist)";
  int copied = 0;
  for (const auto& e : fs::directory_iterator(src)) {
    const std::string n = e.path().filename().string();
    if (n.find("train-labels") != std::string::npos) continue;
    fs::copy_file(e.path(), fs::path(t.path()) / n);
    ++copied;
  }
  ASSERT_GE(copied, 3);
  auto s = load_data(t.path());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("no labels file for split 'train' (expected "
                                      "train-labels-idx1-ubyte[.gz])"),
            std::string::npos)
      << s.status().to_string();
}

TEST(ImageFolder, PillowImagesBecomeClassesInSortedOrder) {
  testing::TempDir t("images");
  NEED_PYTHON(t.path(), R"(
from PIL import Image
for split, n in [('train', 3), ('val', 2)]:
    for k, cls in enumerate(['cat', 'dog', 'emu']):
        os.makedirs(f'{split}/{cls}')
        for i in range(n):
            px = (np.arange(5 * 4 * 3).reshape(5, 4, 3) * (k + 1) + i) % 256
            im = Image.fromarray(px.astype('u1'), 'RGB')
            if cls == 'dog': im = im.convert('L')          # grey among colour: widened
            if cls == 'emu': im = im.convert('RGBA')       # alpha dropped
            im.save(f'{split}/{cls}/{i}.png')
        open(f'{split}/{cls}/notes.txt', 'w').write('not an image')
os.makedirs('bad/train/a'); os.makedirs('bad/train/b'); os.makedirs('bad/test/a')
Image.new('RGB', (4, 5)).save('bad/train/a/0.png'); Image.new('RGB', (6, 5)).save('bad/train/b/0.jpg')
Image.new('RGB', (4, 5)).save('bad/test/a/0.png')
os.makedirs('jpeg/train/x'); os.makedirs('jpeg/train/y'); os.makedirs('jpeg/test/x'); os.makedirs('jpeg/test/y')
for s in ['train', 'test']:
    for c in 'xy':
        Image.new('L', (8, 8), 200 if c == 'x' else 30).save(f'jpeg/{s}/{c}/0.jpg', quality=95)
)");
  auto s = load_data(t.path());
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->train.images.shape(), (Shape{9, 3, 5, 4}));
  EXPECT_EQ(s->test.images.shape(), (Shape{6, 3, 5, 4}));
  EXPECT_EQ(s->train.num_classes, 3);
  EXPECT_EQ(s->train.labels.to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{0, 0, 0, 1, 1, 1, 2, 2, 2}));
  // cat/1.png, channel 2 (blue), row 1, col 3: (((1*4+3)*3+2) * 1 + 1) % 256 = 24.
  EXPECT_EQ(s->train.images.get(1 * 60 + 2 * 20 + 1 * 4 + 3), 24);
  // dog (grey): all three channels carry the same value.
  const std::int64_t dog = 3 * 60;
  for (int p = 0; p < 20; ++p) {
    EXPECT_EQ(s->train.images.get(dog + p), s->train.images.get(dog + 20 + p));
    EXPECT_EQ(s->train.images.get(dog + p), s->train.images.get(dog + 40 + p));
  }
  auto bad = load_data(t.path() + "/bad");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("0.jpg: the image is 6x5 but"), std::string::npos)
      << bad.status().to_string();
  EXPECT_NE(bad.status().message().find("0.png is 4x5"), std::string::npos);
  auto jpeg = load_data(t.path() + "/jpeg");
  ASSERT_TRUE(jpeg.ok()) << jpeg.status().to_string();
  EXPECT_EQ(jpeg->train.images.shape(), (Shape{2, 1, 8, 8}));
  EXPECT_NEAR(jpeg->train.images.get(0), 200, 2);
  EXPECT_NEAR(jpeg->test.images.get(64), 30, 2);
  // A test split with some of the classes (one absent, one empty) maps
  // them by name: emu keeps label 2 of 3 (before: "class folders differ",
  // and an empty folder "holds no images").
  fs::remove_all(t.path() + "/val/cat");
  fs::remove_all(t.path() + "/val/dog");
  fs::create_directories(t.path() + "/val/dog");
  auto subset = load_data(t.path());
  ASSERT_TRUE(subset.ok()) << subset.status().to_string();
  EXPECT_EQ(subset->test.labels.to_vector<std::int32_t>(), (std::vector<std::int32_t>{2, 2}));
  EXPECT_EQ(subset->test.num_classes, 3);
  fs::create_directories(t.path() + "/val/fox");
  auto extra = load_data(t.path());
  ASSERT_FALSE(extra.ok());
  EXPECT_NE(extra.status().message().find("val/fox: a class the training split does not have "
                                          "(its classes: [cat, dog, emu])"),
            std::string::npos)
      << extra.status().to_string();
}

// `shoal train` on NumPy features (an MLP) and on colour image folders (a
// CNN): the formats reach the trainer, which learns from them, and a model
// whose input does not fit the data is refused naming both shapes.
TEST(SourcesCli, TrainsOnNumPyAndImageFolders) {
  testing::TempDir t("sources_cli");
  NEED_PYTHON(t.path(), R"(
from PIL import Image
rng = np.random.default_rng(1)
# Two Gaussian blobs in 8 dimensions: separable, so accuracy climbs well past chance.
def blobs(n):
    y = np.arange(n) % 2
    return (rng.standard_normal((n, 8)) + 2.5 * y[:, None]).astype('f4'), y
xtr, ytr = blobs(512); xte, yte = blobs(256)
np.savez_compressed('blobs.npz', x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
for s, n in [('train', 64), ('test', 32)]:
    for c, colour in [('red', (220, 30, 30)), ('blue', (30, 30, 220))]:
        os.makedirs(f'img/{s}/{c}')
        for i in range(n):
            px = np.clip(rng.normal(colour, 40, (12, 12, 3)), 0, 255).astype('u1')
            Image.fromarray(px, 'RGB').save(f'img/{s}/{c}/{i}.png')
)");
  auto npz = testing::run_shoal(
      fmt::format("train --model mlp --data {0}/blobs.npz --epochs 2 --batch 32 --lr 0.05 --quiet "
                  "--threads 1 --out {0}/run1",
                  t.path()));
  ASSERT_EQ(npz.code, 0) << npz.out;
  double acc = 0;
  ASSERT_EQ(std::sscanf(npz.out.c_str() + npz.out.find("final: test accuracy"),
                        "final: test accuracy %lf", &acc),
            1)
      << npz.out;
  EXPECT_GT(acc, 90) << npz.out;
  auto img = testing::run_shoal(fmt::format(
      "train --model cnn --data {0}/img --epochs 2 --batch 16 --augment --quiet --threads 1 "
      "--out {0}/run2",
      t.path()));
  ASSERT_EQ(img.code, 0) << img.out;
  ASSERT_EQ(std::sscanf(img.out.c_str() + img.out.find("final: test accuracy"),
                        "final: test accuracy %lf", &acc),
            1)
      << img.out;
  EXPECT_GT(acc, 90) << img.out;
  auto flat = testing::run_shoal(fmt::format(
      "train --model cnn --data {0}/blobs.npz --epochs 1 --quiet --out {0}/run3", t.path()));
  EXPECT_NE(flat.code, 0);
  EXPECT_NE(flat.out.find("cnn takes images [C, H, W]; the data's samples are [8]"),
            std::string::npos)
      << flat.out;
}

}  // namespace
}  // namespace shoal::train
