/*
 * dashboard.h: the dashboard page that the HTTP face serves on GET /
 * (dashboard_page.c, generated from dashboard.html by
 * `python3 broker/api/dashboard_test.py --write-page`). Internal to broker/.
 */
#ifndef BATON_BROKER_DASHBOARD_H
#define BATON_BROKER_DASHBOARD_H

extern const char broker_dashboard_html[];
extern const unsigned long broker_dashboard_html_len;

#endif
