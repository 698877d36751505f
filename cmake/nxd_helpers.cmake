# nxd_library(name SOURCES ... DEPS ...): one library per folder. Headers are installed under
# include/nxd/<folder>/ and included as <nxd/<folder>/x.h>; inside the tree the same paths resolve
# through the build-tree include dir that mirrors that layout.
set(NXD_INCLUDE_SHIM ${CMAKE_BINARY_DIR}/include)
file(MAKE_DIRECTORY ${NXD_INCLUDE_SHIM}/nxd)

function(nxd_compile_options target)
  # -Wno-maybe-uninitialized: GCC 12 flags the `__Y = __Y` idiom inside its own AVX-512
  # intrinsic headers (reached through Eigen) thousands of times; the warning is false there.
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter
                                           -Wno-missing-field-initializers -Wno-maybe-uninitialized)
  if(NXD_MARCH AND NOT NXD_SANITIZE STREQUAL "thread")
    target_compile_options(${target} PRIVATE -march=${NXD_MARCH})
  endif()
  if(NOT NXD_DISPATCH_ABOVE_MARCH)
    target_compile_definitions(${target} PRIVATE NXD_NO_DISPATCH_ABOVE_MARCH=1)
  endif()
  if(NXD_SANITIZE STREQUAL "address")
    target_compile_options(${target} PUBLIC -fsanitize=address,undefined -fno-omit-frame-pointer
                                            -fno-sanitize-recover=undefined)
    # GCC 12 with UBSan flags the intentional self-initialisation in avx512fintrin.h's
    # _mm512_undefined_* (GCC PR 105593, a false positive); the release build keeps the warning.
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
      target_compile_options(${target} PRIVATE -Wno-uninitialized)
    endif()
    target_link_options(${target} PUBLIC -fsanitize=address,undefined)
  elseif(NXD_SANITIZE STREQUAL "thread")
    target_compile_options(${target} PUBLIC -fsanitize=thread -fno-omit-frame-pointer)
    target_link_options(${target} PUBLIC -fsanitize=thread)
  endif()
endfunction()

function(nxd_library name)
  cmake_parse_arguments(ARG "" "FOLDER" "SOURCES;HEADERS;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${name} ${ARG_SOURCES})
  add_library(nxd::${name} ALIAS ${name})
  # <nxd/runtime/tensor.h> -> <source>/runtime/tensor.h
  if(NOT EXISTS ${NXD_INCLUDE_SHIM}/nxd/${ARG_FOLDER})
    file(CREATE_LINK ${CMAKE_CURRENT_SOURCE_DIR} ${NXD_INCLUDE_SHIM}/nxd/${ARG_FOLDER} SYMBOLIC)
  endif()
  target_include_directories(${name} PUBLIC $<BUILD_INTERFACE:${NXD_INCLUDE_SHIM}>
                                            $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  nxd_compile_options(${name})
  install(TARGETS ${name} EXPORT nxdTargets)
  install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/nxd/${ARG_FOLDER}
          FILES_MATCHING PATTERN "*.h")
endfunction()
