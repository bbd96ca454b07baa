// EscapeUntrusted: what a forged log line, a terminal escape or a megabyte name look like
// once they reach a log or an error message.
#include "base/escape.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(EscapeTest, PrintableTextIsUnchanged) {
  EXPECT_EQ(EscapeUntrusted("edge-01"), "edge-01");
  EXPECT_EQ(EscapeUntrusted("Fashion-MNIST, 10 parties (IID)"), "Fashion-MNIST, 10 parties (IID)");
  EXPECT_EQ(EscapeUntrusted(""), "");
}

TEST(EscapeTest, NewlinesAndControlCharactersCannotForgeALine) {
  EXPECT_EQ(EscapeUntrusted("w1\n2024-01-01 00:00:00 [coordinator] info job done"),
            "w1\\n2024-01-01 00:00:00 [coordinator] info job done");
  EXPECT_EQ(EscapeUntrusted("a\rb\tc"), "a\\rb\\tc");
  EXPECT_EQ(EscapeUntrusted("\x1b[31mred"), "\\x1b[31mred");
  EXPECT_EQ(EscapeUntrusted(std::string("nul\0byte", 8)), "nul\\x00byte");
  EXPECT_EQ(EscapeUntrusted("del\x7f"), "del\\x7f");
  // A backslash is escaped too, so "\\n" in the output can only come from a newline.
  EXPECT_EQ(EscapeUntrusted("a\\nb"), "a\\\\nb");
}

TEST(EscapeTest, Utf8StaysButInvalidBytesAndHiddenCharactersAreShownAsBytes) {
  EXPECT_EQ(EscapeUntrusted("caf\xC3\xA9"), "caf\xC3\xA9");
  EXPECT_EQ(EscapeUntrusted("bad\xFF\xC3"), "bad\\xff\\xc3");
  EXPECT_EQ(EscapeUntrusted("\xC0\xAF"), "\\xc0\\xaf");  // an overlong '/'
  // U+202E RIGHT-TO-LEFT OVERRIDE would show "txt.exe" as "exe.txt".
  EXPECT_EQ(EscapeUntrusted("a\xE2\x80\xAEtxt.exe"), "a\\xe2\\x80\\xaetxt.exe");
  EXPECT_EQ(EscapeUntrusted("\xC2\x85"), "\\xc2\\x85");  // C1 NEXT LINE
  // U+061C ARABIC LETTER MARK reorders text as U+200F does.
  EXPECT_EQ(EscapeUntrusted("a\xD8\x9C" "b"), "a\\xd8\\x9cb");
  EXPECT_TRUE(HasHiddenCharacters("a\xD8\x9C" "b"));
  EXPECT_FALSE(HasHiddenCharacters("\xD8\xA7"));  // U+0627, an Arabic letter, shows
}

TEST(EscapeTest, LongTextIsCutAndSaysHowLongItWas) {
  const std::string huge(1 << 20, 'x');
  const std::string shown = EscapeUntrusted(huge);
  EXPECT_EQ(shown, std::string(64, 'x') + "\xE2\x80\xA6(1048576 bytes)");
  EXPECT_EQ(EscapeUntrusted(std::string(64, 'y')), std::string(64, 'y'));
  EXPECT_EQ(EscapeUntrusted("abcdef", 3), "abc\xE2\x80\xA6(6 bytes)");
  // Characters, not bytes, are counted; an escaped byte counts once.
  EXPECT_EQ(EscapeUntrusted("\n\n\n\n", 2), "\\n\\n\xE2\x80\xA6(4 bytes)");
}

TEST(EscapeTest, QuoteUntrustedQuotes) { EXPECT_EQ(QuoteUntrusted("a\nb"), "'a\\nb'"); }

TEST(EscapeTest, ValidUtf8ReplacesStrayBytesAndCutsBetweenCharacters) {
  EXPECT_EQ(ValidUtf8("caf\xC3\xA9 \"x\"\n", 64), "caf\xC3\xA9 \"x\"\n");
  EXPECT_EQ(ValidUtf8("a\xFF" "b\xC3", 64), "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
  EXPECT_EQ(ValidUtf8("\xED\xA0\x80", 64), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD") << "a surrogate is not UTF-8";
  // 3 bytes and then a 2-byte character that would end past 4: cut before it.
  EXPECT_EQ(ValidUtf8("abc\xC3\xA9", 4), "abc");
  EXPECT_EQ(ValidUtf8("abc\xC3\xA9", 5), "abc\xC3\xA9");
  EXPECT_EQ(ValidUtf8("ab\xFF", 4), "ab") << "a replacement that does not fit is left out too";
}

TEST(EscapeTest, HiddenCharactersInJsonBecomeUnicodeEscapes) {
  // U+009B (CSI, a terminal escape), U+202E (right-to-left override), U+FEFF; "é" and the
  // JSON's own escapes stay.
  const std::string json = "{\"name\":\"a\xC2\x9B" "2Jb\xE2\x80\xAE" "cd\xEF\xBB\xBF\xC3\xA9\\n\"}";
  EXPECT_EQ(EscapeHiddenInJson(json), "{\"name\":\"a\\u009b2Jb\\u202ecd\\ufeff\xC3\xA9\\n\"}");
  EXPECT_EQ(EscapeHiddenInJson("{\"a\":1}"), "{\"a\":1}");
  // Every mark, embedding, override and isolate that reorders text.
  EXPECT_EQ(EscapeHiddenInJson("\"\xD8\x9C\xE2\x80\x8E\xE2\x80\x8F\xE2\x80\xAA\xE2\x80\xAE\xE2\x81\xA6\xE2\x81\xA9\""),
            "\"\\u061c\\u200e\\u200f\\u202a\\u202e\\u2066\\u2069\"");
}

}  // namespace
}  // namespace tessera
