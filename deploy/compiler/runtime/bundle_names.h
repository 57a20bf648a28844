/* The names a bundle's C sources give its API: DEPLOY_API(_run) is NAME_run for the DEPLOY_PREFIX
 * that bundle_config.h defines (included by bundle.c, cl_bundle.c and runner_glue.c, after it).
 * Every macro is DEPLOY_-prefixed: NAME.h's tensors and an engine's code are named freely. */
#ifndef DEPLOY_BUNDLE_NAMES_H
#define DEPLOY_BUNDLE_NAMES_H

#define DEPLOY_CAT_(a, b) a##b
#define DEPLOY_CAT(a, b) DEPLOY_CAT_(a, b)
#define DEPLOY_API(suffix) DEPLOY_CAT(DEPLOY_PREFIX, suffix)
#define DEPLOY_STRING_(x) #x
#define DEPLOY_STRING(x) DEPLOY_STRING_(x)
#define DEPLOY_EXPORT __attribute__((visibility("default"))) /* the rest is hidden (-fvisibility=hidden) */

#endif
