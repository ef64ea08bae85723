#include <bits/stdc++.h>  // the baseline: the whole standard library
