/* The names a bundle's C sources give its API: API(_run) is NAME_run for the DEPLOY_PREFIX that
 * bundle_config.h defines (included by bundle.c, cl_bundle.c and runner_glue.c, after it). */
#ifndef DEPLOY_BUNDLE_NAMES_H
#define DEPLOY_BUNDLE_NAMES_H

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define API(suffix) CAT(DEPLOY_PREFIX, suffix)
#define STRING_(x) #x
#define STRING(x) STRING_(x)
#define EXPORT __attribute__((visibility("default"))) /* the rest is hidden (-fvisibility=hidden) */

#endif
