# nxd-plot: metrics.csv -> PNG (line charts drawn and encoded by nxd itself: no plotting package).
add_library(nxd_plot STATIC plot/png.cpp plot/canvas.cpp plot/chart.cpp)
target_include_directories(nxd_plot PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(nxd_plot PUBLIC nxd_runtime)
nxd_compile_options(nxd_plot)
add_executable(nxd-plot nxd_plot.cpp)
target_link_libraries(nxd-plot PRIVATE nxd_plot nxd_cli)
nxd_compile_options(nxd-plot)
install(TARGETS nxd-plot RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
