// CUB's radix sorts for the CUDA backend, included through here so that one of CUB's headers
// does not bring in <iostream>: its static stream initializer lives in libstdc++, which this
// library does not link (it links as C). CUB only names std::ostream there, from <ostream>.
#pragma once
#include <ostream>
#if defined(__GLIBCXX__) && !defined(_GLIBCXX_IOSTREAM)
#define _GLIBCXX_IOSTREAM 1
#endif
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>
