# Sourced by setup.sh, sanitize.sh and fuzz.sh: prints the compiler launcher a build tree of the checkout at $1 is
# configured with. The settings live in the launcher (not in the calling shell), so that every later `ninja` in
# that tree uses them:
# - the project's own cache directory;
# - paths relative to the checkout (CCACHE_BASEDIR, CCACHE_NOHASHDIR): a fresh clone in another directory (CI
#   clones main anew) hits what an earlier clone compiled, where absolute paths missed every object;
# - codegen/ compiles against a precompiled header of the MLIR headers; ccache caches such objects only with
#   this sloppiness.
ccache_launcher() {
  printf '%s' "env;CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/lmcc-ccache};CCACHE_BASEDIR=$1;CCACHE_NOHASHDIR=1;CCACHE_SLOPPINESS=pch_defines,time_macros;ccache"
}
