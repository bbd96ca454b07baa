// The XRT backend's host-side control path on XRT's no-op shim (Debian's libxrt1 ships
// libxrt_noop.so): a generated xclbin is parsed and loaded, buffer objects are allocated,
// synced and bound to the GEMM kernel's arguments, the run is started and waited for; every
// other op falls back to the host and is accounted. The shim computes nothing, so GEMM's
// numbers are not checked here (the generic suite skips them on the shim and checks them on a
// card); what is checked is the launch: the arguments read back from the command XRT submitted.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <vector>

#include "device/placement.h"
#include "device/xrt/factory.h"
#include "tessera/config.h"
#include "tests/device/xrt_noop_shim.h"
#if TESSERA_HAVE_XRT
#include "device/xrt/xclbin_writer.h"
#endif

namespace tessera {
namespace {

#if TESSERA_HAVE_XRT

class XrtNoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const test_support::XrtNoopShim shim = test_support::PrepareXrtNoopShim();
    if (!shim.ready) GTEST_SKIP() << shim.reason;
    xclbin_ = shim.xclbin_path;
  }
  std::string xclbin_;
};

TEST_F(XrtNoopTest, DrivesTheGemmKernelAndAccountsHostFallbacks) {
  auto device = CreateXrtDevice(XrtDeviceOptions{.xclbin_path = xclbin_});
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  EXPECT_TRUE(XrtUsesNoopShim());
  EXPECT_NE((*device)->capabilities().name.find("(no-op shim)"), std::string::npos);
  EXPECT_EQ((*device)->capabilities().native_ops, std::set<Op>{Op::kGemm});

  const int m = 8, n = 4, k = 16;
  auto a = (*device)->Allocate(m * k * sizeof(float));
  auto b = (*device)->Allocate(k * n * sizeof(float));
  auto c = (*device)->Allocate(m * n * sizeof(float));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << a.status().ToString();
  EXPECT_FALSE(LastXrtGemmLaunch(**device).has_value()) << "no GEMM has run yet";
  (*device)->Gemm(false, false, m, n, k, 1.0f, a->f32(), b->f32(), 0.0f, c->f32());
  ASSERT_TRUE((*device)->Synchronize().ok()) << (*device)->Synchronize().ToString();
  const std::optional<XrtGemmLaunch> whole = LastXrtGemmLaunch(**device);
  ASSERT_TRUE(whole.has_value());
  // A view into the middle of a buffer, as a model's parameter views are: rows 2.. of a.
  (*device)->Gemm(false, true, m / 2, n, k, 0.5f, a->f32() + k * 2, b->f32(), 2.0f, c->f32());
  ASSERT_TRUE((*device)->Synchronize().ok()) << (*device)->Synchronize().ToString();
  OpPlacement& placement = *(*device)->placement();
  EXPECT_EQ(placement.Native(Op::kGemm).calls, 2u);
  EXPECT_EQ(placement.Fallback(Op::kGemm).calls, 0u);

  // What reached the driver: the command's register map, not the device's intent.
  const std::optional<XrtGemmLaunch> view = LastXrtGemmLaunch(**device);
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->runs, 2u);
  EXPECT_EQ(view->m, m / 2);
  EXPECT_EQ(view->n, n);
  EXPECT_EQ(view->k, k);
  EXPECT_EQ(view->transpose_flags, 2) << "b transposed";
  EXPECT_EQ(view->alpha, 0.5f);
  EXPECT_EQ(view->beta, 2.0f);
  EXPECT_EQ(whole->transpose_flags, 0);
  EXPECT_EQ(whole->alpha, 1.0f);
  EXPECT_EQ(whole->beta, 0.0f);
  // Each bound buffer object covers exactly the operand, and the command carries its address.
  EXPECT_EQ(whole->a.bound_bytes, uint64_t(m) * k * sizeof(float));
  EXPECT_EQ(view->a.bound_bytes, uint64_t(m / 2) * k * sizeof(float));
  EXPECT_EQ(view->b.bound_bytes, uint64_t(k) * n * sizeof(float));
  EXPECT_EQ(view->c.bound_bytes, uint64_t(m / 2) * n * sizeof(float));
  for (const XrtGemmLaunch* launch : {&*whole, &*view}) {
    for (const XrtBufferArgument* argument : {&launch->a, &launch->b, &launch->c}) {
      EXPECT_NE(argument->command_address, 0u);
      EXPECT_EQ(argument->command_address, argument->bound_address);
    }
  }
  EXPECT_EQ(view->a.command_address - whole->a.command_address, uint64_t(k) * 2 * sizeof(float))
      << "the view starts two rows into a";
  EXPECT_EQ(view->b.command_address, whole->b.command_address);
  // The shim gives every buffer object one fake device address (0xDEADBEEF), so that distinct
  // buffers get distinct addresses is for a card to show; offsets within one are checked above.

  std::vector<float> values = {-1.0f, 2.0f, -3.0f, 4.0f};
  ASSERT_TRUE((*device)->CopyHostToDevice(values.data(), *c, 0, values.size() * sizeof(float)).ok());
  (*device)->Relu(4, c->f32(), c->f32());
  std::vector<float> got(4);
  ASSERT_TRUE((*device)->CopyDeviceToHost(*c, 0, got.data(), got.size() * sizeof(float)).ok());
  EXPECT_EQ(got, (std::vector<float>{0.0f, 2.0f, 0.0f, 4.0f}));
  EXPECT_EQ(placement.Fallback(Op::kRelu).calls, 1u);
  EXPECT_EQ(placement.Fallback(Op::kRelu).bytes_to_host, 16u);
  EXPECT_EQ(placement.Fallback(Op::kRelu).bytes_to_device, 16u);
}

TEST_F(XrtNoopTest, ADeviceOnAnEmulationShimIsLabelledEmulatedNamingTheMode) {
  auto device = CreateXrtDevice(XrtDeviceOptions{.xclbin_path = xclbin_});
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  const DeviceCapabilities& capabilities = (*device)->capabilities();
  EXPECT_TRUE(capabilities.emulated) << capabilities.name;
  EXPECT_NE(capabilities.name.find("emulated"), std::string::npos) << capabilities.name;
  EXPECT_NE(capabilities.name.find("XCL_EMULATION_MODE=noop"), std::string::npos) << capabilities.name;
}

TEST_F(XrtNoopTest, AMissingXclbinOrKernelIsNamed) {
  auto missing = CreateXrtDevice(XrtDeviceOptions{.xclbin_path = ::testing::TempDir() + "absent.xclbin"});
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("absent.xclbin"), std::string::npos) << missing.status().ToString();

  const std::string other = ::testing::TempDir() + "other_kernel.xclbin";
  ASSERT_TRUE(xrt_backend::WriteXclbin(xrt_backend::GemmKernelSpec("vadd"), other).ok());
  auto wrong = CreateXrtDevice(XrtDeviceOptions{.xclbin_path = other});
  EXPECT_EQ(wrong.status().code(), StatusCode::kNotFound);
  for (const char* part : {"other_kernel.xclbin", "tessera_gemm", "vadd"}) {
    EXPECT_NE(wrong.status().message().find(part), std::string::npos) << wrong.status().ToString();
  }
}

// The xclbin's path and the kernel names it holds are the file's to choose: shown escaped.
TEST_F(XrtNoopTest, TheXclbinsPathAndKernelNamesAreShownEscaped) {
  const std::string forged = ::testing::TempDir() + "forged\x1b[2J.xclbin";
  ASSERT_TRUE(xrt_backend::WriteXclbin(xrt_backend::GemmKernelSpec("vadd\x1b[31m"), forged).ok());
  auto wrong = CreateXrtDevice(XrtDeviceOptions{.xclbin_path = forged});
  ASSERT_FALSE(wrong.ok());
  const std::string& message = wrong.status().message();
  EXPECT_EQ(message.find('\x1b'), std::string::npos) << message;
  EXPECT_NE(message.find("forged\\x1b[2J.xclbin"), std::string::npos) << message;
}

#endif  // TESSERA_HAVE_XRT

TEST(XrtEmulationModeTest, EveryEmulationModeCountsNotOnlyTheNoopShim) {
  for (const char* mode : {"noop", "sw_emu", "hw_emu"}) {
    test_support::ScopedEnvironmentVariable emulation("XCL_EMULATION_MODE", mode);
    EXPECT_EQ(XrtEmulationMode(), mode);
    EXPECT_EQ(XrtUsesNoopShim(), std::string(mode) == "noop") << mode;
  }
  test_support::ScopedEnvironmentVariable card("XCL_EMULATION_MODE", "");
  EXPECT_EQ(XrtEmulationMode(), "") << "an empty mode is a card";
}

TEST(XrtViabilityTest, SaysWhyWithoutAnXclbin) {
  unsetenv("TESSERA_XRT_XCLBIN");
  Viability viability = XrtViability();
  EXPECT_FALSE(viability.viable);
  EXPECT_FALSE(viability.reason.empty());
}

#if TESSERA_HAVE_XRT
// TESSERA_XRT_XCLBIN comes from the environment: a name the kernel refuses to look up (too
// long here) is a reason, shown bounded and escaped, never an exception that ends the process.
TEST(XrtViabilityTest, AnXclbinPathThatCannotBeLookedUpIsAReasonNotACrash) {
  const std::string long_path = "/" + std::string(5000, 'a') + "\x1b[31m.xclbin";
  test_support::ScopedEnvironmentVariable xclbin("TESSERA_XRT_XCLBIN", long_path);
  Viability viability;
  ASSERT_NO_THROW(viability = XrtViability());
  EXPECT_FALSE(viability.viable);
  EXPECT_NE(viability.reason.find("cannot be read"), std::string::npos) << viability.reason;
  EXPECT_LT(viability.reason.size(), 600u) << viability.reason;
  EXPECT_EQ(viability.reason.find('\x1b'), std::string::npos) << viability.reason;

  std::optional<Status> created;
  ASSERT_NO_THROW(created = CreateXrtDevice().status());
  EXPECT_EQ(created->code(), StatusCode::kNotFound) << created->ToString();
  EXPECT_LT(created->message().size(), 600u) << created->ToString();

  // A directory is not an xclbin either.
  auto directory = CreateXrtDevice(XrtDeviceOptions{.xclbin_path = ::testing::TempDir()});
  EXPECT_EQ(directory.status().code(), StatusCode::kNotFound);
  EXPECT_NE(directory.status().message().find("not a regular file"), std::string::npos)
      << directory.status().ToString();
}
#endif  // TESSERA_HAVE_XRT

}  // namespace
}  // namespace tessera
