"""Image builds: the build context, the manifest every image carries, and `sm120 build`."""
