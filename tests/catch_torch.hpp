// Catch2 in a TU that also includes LibTorch: Debian's LibTorch pulls in glog, whose CHECK macro
// would silently replace Catch2's (a failed CHECK would abort instead of being reported).
#pragma once
#include <ATen/ATen.h>
#undef CHECK
#include <catch2/catch.hpp>
