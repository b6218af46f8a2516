# Image decoders for src/vision (Debian: libpng-dev, libjpeg62-turbo-dev,
# libwebp-dev). Kept private to the library: no vision header exposes them.
pkg_check_modules(REPRISE_PNG REQUIRED IMPORTED_TARGET libpng)
pkg_check_modules(REPRISE_JPEG REQUIRED IMPORTED_TARGET libjpeg)
pkg_check_modules(REPRISE_WEBP REQUIRED IMPORTED_TARGET libwebp)
target_link_libraries(reprise PRIVATE PkgConfig::REPRISE_PNG PkgConfig::REPRISE_JPEG
                      PkgConfig::REPRISE_WEBP)
